"""On a CUDA device (docs/gpu.md): the commands with `--device cuda`, generation and sampling on the GPU against
the CPU's, training in bfloat16 and float16 mixed precision. Marked `gpu`: where torch finds no CUDA device they are
skipped with the reason (tests/conftest.py), and listed as skipped; `python -m pytest -m gpu` runs them on a GPU
machine."""

import json

import pytest
import torch
from conftest import cli_output

from hf_ext.cli import main

pytestmark = pytest.mark.gpu


def test_optimus_encode_on_cuda_in_bfloat16_is_close_to_cpu_float32(optimus_sample_folder, capsys):
    argv = ["optimus", "encode", optimus_sample_folder, "a dog runs .", "the cat sleeps ."]
    cpu = [json.loads(line) for line in cli_output(capsys, *argv, "--device", "cpu").splitlines()]
    gpu = [json.loads(line)
           for line in cli_output(capsys, *argv, "--device", "cuda", "--dtype", "bfloat16").splitlines()]
    for row, gpu_row in zip(cpu, gpu, strict=True):
        for key in ("mean", "logvar"):
            torch.testing.assert_close(torch.tensor(gpu_row[key]), torch.tensor(row[key]), atol=0.05, rtol=0.02)


def test_optimus_text_commands_on_cuda_give_the_cpu_tokens(optimus_sample_folder, capsys):
    # float32 greedy decoding, and prior samples from the same seeded CPU generator: the same tokens on either device
    for tool, extra in (("reconstruct", ["a dog runs .", "the cat sleeps ."]), ("sample", ["--num", "4"]),
                        ("interpolate", ["a dog runs .", "the cat sleeps .", "--steps", "3"])):
        argv = ["optimus", tool, optimus_sample_folder, *extra, "--max-new-tokens", "8"]
        assert cli_output(capsys, *argv, "--device", "cuda") == cli_output(capsys, *argv, "--device", "cpu"), tool


def test_generation_and_sampling_with_the_python_api_on_cuda(optimus_sample_folder):
    from hf_ext.models.optimus import OptimusLatentSpace

    cpu = OptimusLatentSpace.from_pretrained(str(optimus_sample_folder), max_new_tokens=8)
    gpu = OptimusLatentSpace.from_pretrained(str(optimus_sample_folder), device_map="cuda", max_new_tokens=8)
    assert gpu.model.device.type == "cuda"
    assert gpu.reconstruct(["a dog runs ."]) == cpu.reconstruct(["a dog runs ."])
    # a CPU generator: the same latents on the GPU; a CUDA generator: drawn there
    latents = gpu.model.sample_prior(3, torch.Generator().manual_seed(5))
    assert latents.device.type == "cuda"
    torch.testing.assert_close(latents.cpu(), cpu.model.sample_prior(3, torch.Generator().manual_seed(5)))
    drawn = gpu.model.sample_prior(3, torch.Generator(device="cuda").manual_seed(5))
    assert drawn.device.type == "cuda" and drawn.dtype == torch.float32
    assert gpu.sample(2, generator=torch.Generator().manual_seed(5)) == cpu.sample(
        2, generator=torch.Generator().manual_seed(5))
    half = OptimusLatentSpace.from_pretrained(str(optimus_sample_folder), dtype=torch.bfloat16, device_map="cuda",
                                              max_new_tokens=8)
    assert half.model.sample_prior(2, torch.Generator(device="cuda").manual_seed(1)).dtype == torch.bfloat16
    assert len(half.sample(2, generator=torch.Generator().manual_seed(5))) == 2


def test_halting_map_on_cuda_equals_cpu(algorithmic_seq2seq_folder, tmp_path, capsys):
    argv = ["universal-transformer", "halting-map", algorithmic_seq2seq_folder, "12345"]
    cpu = json.loads(cli_output(capsys, *argv, tmp_path / "cpu.png", "--device", "cpu"))["rows"]
    gpu = json.loads(cli_output(capsys, *argv, tmp_path / "gpu.png", "--device", "cuda"))["rows"]
    assert [row["tokens"] for row in gpu] == [row["tokens"] for row in cpu]
    for row, gpu_row in zip(cpu, gpu, strict=True):
        assert gpu_row["ponder_time"] == pytest.approx(row["ponder_time"], abs=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_optimus_train_on_cuda_in_mixed_precision(optimus_sample_folder, tmp_path, capsys, dtype):
    (tmp_path / "train.txt").write_text("a dog runs .\nthe cat sleeps .\na man walks .\na woman reads .\n")
    summary = json.loads(cli_output(capsys, "optimus", "train", optimus_sample_folder, "--train-file",
                                    tmp_path / "train.txt",
                             "--output-dir", tmp_path / "out", "--max-steps", "2", "--batch-size", "2",
                             "--device", "cuda", "--dtype", dtype))
    assert summary["steps"] == 2 and summary["train_loss"] > 0


def test_the_demo_trains_and_queries_its_model_on_cuda(tmp_path, capsys):
    out = cli_output(capsys, "demo", "--workdir", tmp_path / "demo", "--max-steps", "2", "--device", "cuda", "--dtype",
              "bfloat16")
    assert "5. reconstructions" in out and (tmp_path / "demo" / "demo.json").is_file()


def test_universal_transformer_trains_on_cuda_in_bfloat16(tmp_path, capsys):
    summary = json.loads(cli_output(capsys, "universal-transformer", "train-algorithmic", "--task", "copy",
                                    "--output-dir",
                             tmp_path / "ut", "--train-length", "3", "--test-length", "4", "--num-train", "16",
                             "--num-test", "4", "--max-steps", "2", "--batch-size", "4", "--hidden-size", "16",
                             "--num-heads", "2", "--intermediate-size", "16", "--act-max-steps", "2",
                             "--device", "cuda", "--dtype", "bfloat16"))
    assert summary["train_loss"] > 0


def test_a_cuda_device_beyond_the_machines_is_refused(optimus_sample_folder, capsys):
    count = torch.cuda.device_count()
    with pytest.raises(SystemExit) as usage_error:  # refused while the arguments are parsed
        main(["optimus", "encode", str(optimus_sample_folder), "a dog", "--device", f"cuda:{count}"])
    assert usage_error.value.code == 2
    assert f"argument --device: cuda:{count}: this machine has {count} CUDA device" in capsys.readouterr().err
