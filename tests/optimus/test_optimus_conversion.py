"""`hf-ext convert optimus`: parity with the original code's outputs on the tiny fixture (both checkpoint layouts),
other configurations written in the original format, and one clear error for every kind of bad input."""

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROCESS_TIMEOUT
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoProcessor, BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.cli import main
from hf_ext.export import sha256
from hf_ext.models.optimus import kl_per_dimension
from hf_ext.models.optimus.conversion import ARGS_FILE, WEIGHTS_FILE, _loading_problems, round_trip_error
from hf_ext.models.optimus.modeling_optimus import CACHE_NAME
from hf_ext.models.optimus.samples import (
    random_model,
    tiny_config,
    write_original_checkpoint,
    write_sample_checkpoint,
)

ATOL = 1e-5
RTOL = 1.3e-6  # torch's default for float32 (assert_close takes both or neither)


def assert_matches(actual, expected):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def run_cli(capsys, *argv):
    """`hf-ext ARGV` in this process: (exit code, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_info:  # argparse's usage errors and --help
        code = exit_info.code
    return code, capsys.readouterr().err


def run_script(script, *argv):
    """A `conversion/` script as `python SCRIPT ARGV` would run it, in this process: its exit code."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [str(script), *map(str, argv)])
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(str(script), run_name="__main__")
    return exit_info.value.code


def load(folder, **config_changes):
    return AutoModel.from_pretrained(folder, **config_changes).eval()


def step_folder(root, kind):
    """The only `checkpoint-{kind}-N` folder under `root` (whatever N is)."""
    (folder,) = Path(root).glob(f"checkpoint-{kind}-*")
    return folder


# ----- parity with the original code on the fixture ------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(optimus_tiny):
    tensors = load_file(str(optimus_tiny / "reference.safetensors"))
    meta = json.loads((optimus_tiny / "reference.json").read_text())
    return tensors, meta


@pytest.fixture(scope="module")
def converted_from_training_bin(optimus_tiny, repo_root, tmp_path_factory):
    """The fixture's checkpoint-full-N/training.bin converted by the conversion/ script."""
    out = tmp_path_factory.mktemp("optimus_full") / "converted"
    script = repo_root / "conversion" / "convert_optimus_original_checkpoint.py"
    assert run_script(script, step_folder(optimus_tiny, "full") / "training.bin", out) == 0
    return out


@pytest.fixture(params=["split folders", "training.bin"])
def converted(request):
    name = "optimus_tiny_converted" if request.param == "split folders" else "converted_from_training_bin"
    return request.getfixturevalue(name)


def test_config_comes_from_the_checkpoint_and_its_training_args(converted, reference):
    _, meta = reference
    args, config = meta["checkpoint"]["args"], load(converted).config
    assert config.latent_size == args["latent_size"]
    assert config.latent_as_gpt_memory == bool(args["latent_as_gpt_memory"])
    assert config.latent_as_gpt_emb == bool(args["latent_as_gpt_emb"])
    assert config.beta == args["beta"]
    assert config.dim_target_kl == args["dim_target_kl"]
    assert config.length_weighted_loss == args["length_weighted_loss"]
    assert config.fb_mode == (2 if args["use_deterministic_connect"] else 1)
    sizes = {"encoder": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                         "max_position_embeddings", "layer_norm_eps"),
             "decoder": ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions", "layer_norm_epsilon")}
    for side, keys in sizes.items():
        original = meta[f"{side}_config_json"]
        assert {k: getattr(getattr(config, side), k) for k in keys} == {k: original[k] for k in keys}
    special = meta["decoder_special_ids"]
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == \
        (special["pad"], special["bos"], special["eos"])
    # training.bin too takes its configs from the sibling folders (this fixture's heads could not be inferred)
    assert "inferred" not in (converted / "README.md").read_text()


def test_encoder_and_posterior(converted, reference):
    ref, _ = reference
    model = load(converted)
    with torch.no_grad():
        mean, logvar, encoder_outputs = model.encode(ref["enc_input_ids"])
    assert_matches(encoder_outputs.last_hidden_state, ref["enc_last_hidden"])
    assert_matches(encoder_outputs.pooler_output, ref["enc_pooled"])
    assert_matches(mean, ref["mean"])
    assert_matches(logvar, ref["logvar"])
    assert_matches(kl_per_dimension(mean, logvar), ref["kl_per_dim"])


@pytest.mark.parametrize("fb_mode, name", [(0, "kl"), (1, "kl_fb1"), (2, "kl_fb2")])
def test_kl_under_each_free_bits_mode(converted, reference, fb_mode, name):
    ref, meta = reference
    model = load(converted, fb_mode=fb_mode, dim_target_kl=meta["reference_settings"]["dim_target_kl"])
    with torch.no_grad():
        outputs = model(input_ids=ref["enc_input_ids"], labels=ref["dec_labels"], latent_z=ref["z"])
    assert_matches(outputs.loss_kl, ref[name])


def test_decoder_logits_cache_and_reconstruction_loss(converted, reference):
    ref, _ = reference
    model = load(converted)
    with torch.no_grad():
        assert_matches(model.latent_to_memory(ref["z"]), ref["dec_memory_vec"])
        assert_matches(model.latent_to_embedding(ref["z"]), ref["dec_emb_vec"])
        outputs = model(labels=ref["dec_labels"], latent_z=ref["z"], use_cache=True)
    assert_matches(outputs.logits, ref["dec_logits"])
    assert_matches(outputs.loss_rec, ref["loss_rec"])
    cache = outputs[CACHE_NAME]
    assert len(cache.layers) == model.config.decoder.n_layer
    for layer, entry in enumerate(cache.layers):  # the original's `present`: stack(key, value), memory in slot 0
        assert_matches(torch.stack([entry.keys, entry.values]), ref[f"dec_present_{layer}"])


@pytest.mark.parametrize("memory, embedding, with_latent, logits_name, loss_name", [
    (True, False, True, "dec_logits_mem_only", "loss_rec_mem_only"),
    (False, True, True, "dec_logits_emb_only", "loss_rec_emb_only"),
    (True, False, False, "dec_logits_no_latent", None),
])
def test_injection_switches(converted, reference, memory, embedding, with_latent, logits_name, loss_name):
    ref, _ = reference
    model = load(converted, latent_as_gpt_memory=memory, latent_as_gpt_emb=embedding)
    with torch.no_grad():
        outputs = model(labels=ref["dec_labels"], latent_z=ref["z"] if with_latent else None)
    assert_matches(outputs.logits, ref[logits_name])
    if loss_name:
        assert_matches(outputs.loss_rec, ref[loss_name])


@pytest.mark.parametrize("name, fb_mode, length_weighted", [
    ("vae_loss_lw_fb1", 1, True), pytest.param("vae_loss_lw_fb0", 0, True, marks=pytest.mark.slow),
    pytest.param("vae_loss_nolw_fb1", 1, False, marks=pytest.mark.slow),
])
def test_vae_loss(converted, reference, name, fb_mode, length_weighted):
    ref, meta = reference
    settings = meta["reference_settings"]
    model = load(converted, fb_mode=fb_mode, length_weighted_loss=length_weighted, beta=settings["beta"],
                 dim_target_kl=settings["dim_target_kl"])
    labels = ref["dec_labels"]
    sent_length = (labels != model.config.decoder.pad_token_id).sum(-1).float()
    assert_matches(sent_length, ref["sent_length"])
    with torch.no_grad():
        outputs = model(input_ids=ref["enc_input_ids"], labels=labels, latent_z=ref["z"])
    rec = outputs.loss_rec / sent_length if length_weighted else outputs.loss_rec
    assert_matches(rec + settings["beta"] * outputs.loss_kl, ref[name])
    assert_matches(outputs.loss, ref[name].mean())


def test_greedy_generation(converted, reference):
    ref, meta = reference
    model = load(converted)
    expected = ref["gen_tokens"]  # BOS, then the greedy tokens; -1 after an early <EOS>
    with torch.no_grad():
        generated = model.generate(latent_z=ref["gen_z"], max_new_tokens=meta["reference_settings"]["greedy_steps"],
                                   do_sample=False, output_logits=True, return_dict_in_generate=True)
    produced = generated.sequences[:, :expected.shape[1]]
    assert produced.shape == expected.shape
    valid = expected >= 0
    assert torch.equal(produced[valid], expected[valid])
    step_logits = torch.stack(generated.logits, 1)
    assert_matches(step_logits[valid[:, 1:]], ref["gen_step_logits"][valid[:, 1:]])


def test_model_card_records_sources_and_parity(optimus_tiny_converted, optimus_tiny):
    card = ModelCard.load(optimus_tiny_converted / "README.md")
    assert card.data.library_name == "transformers" and "optimus" in card.data.tags
    rows = {name: (error, tolerance) for name, error, tolerance in
            re.findall(r"^\| ([\w ()]+) \| ([0-9.e+-]+) \| ([\w .,-]+) \|$", card.text, re.MULTILINE)}
    for name in ("enc_last_hidden", "enc_pooled", "mean", "logvar", "dec_logits", "loss_rec"):
        assert float(rows[name][0]) <= ATOL and rows[name][1] == "atol 1e-05", name
    assert rows["weights (round trip)"] == ("0", "exact")
    weights = step_folder(optimus_tiny, "encoder") / WEIGHTS_FILE
    assert f"| `{weights.parent.name}/{weights.name}` | {weights.stat().st_size} | `{sha256(weights)}` |" in card.text


@pytest.mark.slow
def test_flag_override_wins_over_the_training_args(optimus_tiny, reference, tmp_path, capsys):
    ref, meta = reference
    code, _ = run_cli(capsys, "convert", "optimus", optimus_tiny, tmp_path / "out", "--latent-as-gpt-emb", "0")
    assert code == 0
    model = load(tmp_path / "out")
    assert not model.config.latent_as_gpt_emb
    assert model.config.latent_as_gpt_memory == bool(meta["checkpoint"]["args"]["latent_as_gpt_memory"])
    with torch.no_grad():
        assert_matches(model(labels=ref["dec_labels"], latent_z=ref["z"]).logits, ref["dec_logits_mem_only"])


@pytest.mark.slow
def test_conversion_script_help(repo_root, capsys):
    script = repo_root / "conversion" / "convert_optimus_original_checkpoint.py"
    assert run_script(script, "--help") == 0
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: {script.name}")
    for option in ("--encoder", "--decoder", "--step", "--latent-as-gpt-memory", "--latent-as-gpt-emb", "--reference",
                   "--overwrite", "--push-to-hub"):
        assert option in usage


@pytest.mark.slow
def test_exit_codes_of_the_installed_command(optimus_tiny, optimus_tiny_converted, tmp_path):
    command = Path(sys.executable).with_name("hf-ext")
    command = [str(command)] if command.exists() else [sys.executable, "-m", "hf_ext.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # both processes at once: their start-up (imports) dominates
    good = subprocess.Popen([*command, "convert", "optimus", str(optimus_tiny), str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    bad = subprocess.Popen([*command, "convert", "optimus", str(tmp_path / "absent"), str(tmp_path / "out2")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    (_, good_err), (_, bad_err) = good.communicate(timeout=PROCESS_TIMEOUT), bad.communicate(timeout=PROCESS_TIMEOUT)
    assert good.returncode == 0, good_err
    ours, in_process = (load_file(str(f / "model.safetensors")) for f in (tmp_path / "out", optimus_tiny_converted))
    assert ours.keys() == in_process.keys() and all(torch.equal(ours[k], in_process[k]) for k in ours)
    assert bad.returncode == 1
    assert bad_err.strip().splitlines()[-1].startswith("hf-ext: error: source") and "does not exist" in bad_err
    assert not (tmp_path / "out2").exists()


# ----- other configurations, written in the original format -------------------------------------------------------


def assert_reproduces(folder, source):
    """The converted folder holds `source`'s weights and settings and computes exactly what `source` computes."""
    converted = load(folder)
    for field in ("latent_size", "latent_as_gpt_memory", "latent_as_gpt_emb", "beta", "fb_mode", "dim_target_kl",
                  "length_weighted_loss", "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id"):
        assert getattr(converted.config, field) == getattr(source.config, field), field
    ours, theirs = converted.state_dict(), source.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    config, generator = source.config, torch.Generator().manual_seed(0)
    enc_ids = torch.randint(5, config.encoder.vocab_size, (3, 9), generator=generator)
    enc_ids[1, 6:] = config.encoder.pad_token_id
    labels = torch.randint(0, config.decoder.pad_token_id, (3, 7), generator=generator)
    labels[:, 0], labels[:, -1] = config.decoder.bos_token_id, config.decoder.eos_token_id
    labels[2, 3], labels[2, 4:] = config.decoder.eos_token_id, config.decoder.pad_token_id
    with torch.no_grad():
        a = converted(input_ids=enc_ids, labels=labels)
        b = source(input_ids=enc_ids, labels=labels)
        for name in ("loss", "loss_rec", "loss_kl", "logits", "mean", "logvar", "latent_z"):
            assert torch.equal(a[name], b[name]), name
        greedy = [m.generate(latent_z=a.mean, max_new_tokens=4, do_sample=False) for m in (converted, source)]
    assert torch.equal(*greedy)
    return converted


@pytest.mark.parametrize("sizes", [
    dict(latent_size=5, hidden_size=48, num_layers=3, num_heads=6),
    dict(latent_size=3, num_layers=1, num_heads=2, latent_as_gpt_emb=False),  # memory only
    dict(latent_size=12, latent_as_gpt_memory=False, beta=0.5, dim_target_kl=0.1, length_weighted_loss=True),
    dict(latent_size=7, tie_word_embeddings=False, fb_mode=2),
], ids=["latent5-3layers-6heads", "memory-only", "embedding-only", "untied-deterministic"])
@pytest.mark.slow
def test_other_configurations(tmp_path, capsys, sizes):
    source = write_sample_checkpoint(tmp_path / "original", seed=11, **sizes)
    assert run_cli(capsys, "convert", "optimus", tmp_path / "original", tmp_path / "out")[0] == 0
    converted = assert_reproduces(tmp_path / "out", source)
    tied = torch.equal(converted.lm_head.weight, converted.decoder.wte.weight)
    assert tied == source.config.tie_word_embeddings


@pytest.mark.slow
def test_processor_from_the_checkpoint_tokenizers(tmp_path, capsys):
    source = write_sample_checkpoint(tmp_path / "original", seed=5, latent_size=4)
    encoder_dir, decoder_dir = (step_folder(tmp_path / "original", kind) for kind in ("encoder", "decoder"))
    code, _ = run_cli(capsys, "convert", "optimus", "--encoder", encoder_dir, "--decoder", decoder_dir,
                      tmp_path / "out")
    assert code == 0
    model = assert_reproduces(tmp_path / "out", source)
    processor = AutoProcessor.from_pretrained(tmp_path / "out")
    decoder, config = processor.decoder_tokenizer, model.config
    assert len(decoder) == config.decoder.vocab_size
    assert (decoder.pad_token_id, decoder.bos_token_id, decoder.eos_token_id) == \
        (config.decoder.pad_token_id, config.decoder.bos_token_id, config.decoder.eos_token_id)
    assert processor.tokenizer.pad_token_id == config.encoder.pad_token_id
    vocab = (encoder_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert processor.tokenizer.convert_ids_to_tokens(list(range(len(vocab)))) == vocab
    batch = processor(["a man is playing a guitar .", "a dog runs ."])
    assert (batch["labels"][:, 0] == config.decoder.bos_token_id).all()
    with torch.no_grad():
        ours = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        theirs = source(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    assert torch.equal(ours.loss, theirs.loss)


@pytest.mark.slow
def test_step_selection(tmp_path, capsys):
    sources = {step: write_sample_checkpoint(tmp_path / "original", seed=step, step=step) for step in (9, 10)}
    assert run_cli(capsys, "convert", "optimus", tmp_path / "original", tmp_path / "latest")[0] == 0
    assert_reproduces(tmp_path / "latest", sources[10])  # by number: 10 sorts before 9 as text
    assert run_cli(capsys, "convert", "optimus", tmp_path / "original", tmp_path / "nine", "--step", "9")[0] == 0
    assert_reproduces(tmp_path / "nine", sources[9])


@pytest.mark.slow
def test_training_bin_without_configs_infers_them(tmp_path, capsys):
    """Only checkpoint-full-N/ folders: sizes come from the weights, heads from the 64-dim convention."""
    sources = {}
    for step in (2, 5):
        config = tiny_config(40, 50, latent_size=4, hidden_size=128, num_heads=2, latent_as_gpt_emb=step == 5)
        sources[step] = random_model(config, seed=step)
        write_original_checkpoint(tmp_path / "original", sources[step], step=step, split=False)
    assert run_cli(capsys, "convert", "optimus", tmp_path / "original", tmp_path / "latest")[0] == 0
    assert_reproduces(tmp_path / "latest", sources[5])
    assert "inferred from weight shapes" in (tmp_path / "latest" / "README.md").read_text()
    code, _ = run_cli(capsys, "convert", "optimus", tmp_path / "original" / "checkpoint-full-2", tmp_path / "two")
    assert code == 0
    assert_reproduces(tmp_path / "two", sources[2])


@pytest.mark.slow
def test_round_trip_error_compares_every_stored_tensor_block_by_block(tmp_path):
    """The converter's weight check: exact zero for a faithful file, the largest difference otherwise (found in any
    block of rows, scalars included), tied copies that the file does not store skipped, and `written` emptied."""
    generator = torch.Generator().manual_seed(0)
    stored = {"matrix": torch.randn(37, 5, generator=generator), "vector": torch.randn(11, generator=generator),
              "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 5)}
    save_file(stored, tmp_path / "model.safetensors")

    def written(**changes):
        tensors = {name: tensor.clone() for name, tensor in stored.items()}
        tensors["tied.copy"] = tensors["matrix"]  # a tied name: in the model, not in the file
        for name, (index, delta) in changes.items():
            tensors[name][index] += delta
        return tensors

    faithful = written()
    assert round_trip_error(tmp_path / "model.safetensors", faithful, block_bytes=3 * 5 * 4) == 0.0
    assert faithful == {}
    # 3-row blocks: row 36 is alone in the last block
    for name, index, delta in (("matrix", (36, 4), 0.25), ("matrix", (0, 0), -0.5), ("vector", (7,), 0.125),
                               ("scalar", (), 1.0)):
        changed = written(**{name: (index, delta)})
        error = round_trip_error(tmp_path / "model.safetensors", changed, block_bytes=3 * 5 * 4)
        assert error == pytest.approx(abs(delta)), name


def test_loading_problems_names_what_did_not_load():
    assert _loading_problems({"missing_keys": set(), "unexpected_keys": [], "mismatched_keys": [],
                              "error_msgs": []}) == ""
    text = _loading_problems({"missing_keys": {"decoder.h.0.ln_1.weight"}, "unexpected_keys": ["extra.bias"],
                              "mismatched_keys": [], "error_msgs": []})
    assert text == "missing keys: decoder.h.0.ln_1.weight; unexpected keys: extra.bias"


# ----- bad input ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_original(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample") / "original"
    write_sample_checkpoint(root, seed=2, latent_size=6, hidden_size=32, num_heads=4)
    return root


@pytest.fixture
def original(sample_original, tmp_path):
    """A private copy of an original-format output folder, to break."""
    return Path(shutil.copytree(sample_original, tmp_path / "original"))


def edit_weights(path, edit):
    """Change a state-dict file in place (`edit` mutates the dict), keeping the original's legacy format."""
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path, _use_new_zipfile_serialization=False)


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def tiny_bert_state(original):
    config = json.loads((step_folder(original, "encoder") / "config.json").read_text())
    return BertModel(BertConfig(**config)).state_dict()


def tiny_gpt2_state(original):
    config = json.loads((step_folder(original, "decoder") / "config.json").read_text())
    return GPT2LMHeadModel(GPT2Config(**config)).state_dict()


def drop(key):
    return lambda state: state.pop(key)


def break_source(case, original, tmp_path):
    """Make the broken input of `case`; returns the arguments before OUT."""
    encoder, decoder = (step_folder(original, kind) / WEIGHTS_FILE for kind in ("encoder", "decoder"))
    if case == "missing source":
        return [tmp_path / "absent"]
    if case == "empty source":
        (tmp_path / "empty").mkdir()
        return [tmp_path / "empty"]
    if case == "truncated pytorch_model.bin":
        truncate(encoder)
    elif case == "truncated training.bin":
        return [truncate(step_folder(original, "full") / "training.bin")]
    elif case == "text file":
        (tmp_path / "notes.txt").write_text("step 100: loss 6.82\nthis is not a checkpoint\n")
        return [tmp_path / "notes.txt"]
    elif case == "plain BERT encoder":
        torch.save(tiny_bert_state(original), encoder)
    elif case == "plain GPT-2 decoder":
        torch.save(tiny_gpt2_state(original), decoder)
    elif case == "missing key":
        edit_weights(decoder, drop("transformer.h.0.mlp.c_fc.bias"))
    elif case == "missing sizing key":
        edit_weights(decoder, drop("transformer.wte.weight"))
    elif case == "unexpected key":
        edit_weights(encoder, lambda state: state.update({"adapter.weight": torch.zeros(2)}))
    elif case == "shape mismatch":
        edit_weights(decoder, lambda state: state.update({"transformer.wpe.weight": torch.zeros(70, 32)}))
    elif case == "latent sizes disagree":
        def shrink_latent(state):
            for key in ("transformer.linear.weight", "transformer.linear_emb.weight"):
                state[key] = state[key][:, :2]
        edit_weights(decoder, shrink_latent)
    elif case == "encoder folder only":
        shutil.rmtree(step_folder(original, "decoder"))
        shutil.rmtree(step_folder(original, "full"))
    elif case == "no configs, heads not inferable":
        for kind in ("encoder", "decoder"):
            shutil.rmtree(step_folder(original, kind))
    return [original]


BAD_SOURCES = {
    "missing source": r"source .*absent does not exist",
    "empty source": r"source .*empty is empty",
    "truncated pytorch_model.bin": r"encoder weights .*pytorch_model\.bin is truncated or corrupt",
    "truncated training.bin": r"checkpoint .*training\.bin is truncated or corrupt",
    "text file": r"notes\.txt is not a torch checkpoint",
    "plain BERT encoder": r"checkpoint-encoder-\d+: the encoder weights are not an Optimus encoder .*plain BERT",
    "plain GPT-2 decoder": r"checkpoint-decoder-\d+: the decoder weights are not an Optimus decoder .*plain GPT-2",
    "missing key": r"missing 1 weight\(s\): decoder\.h\.0\.mlp\.c_fc\.bias",
    "missing sizing key": r"checkpoint-decoder-\d+: the decoder weights lack transformer\.wte\.weight",
    "unexpected key": r"unexpected 1 weight\(s\): encoder\.adapter\.weight",
    "shape mismatch": r"decoder\.wpe\.weight has shape \(70, 32\), the config expects \(64, 32\)",
    "latent sizes disagree": r"latent sizes disagree: the encoder produces 6, the decoder reads 2",
    "encoder folder only": r"source .*original holds no Optimus checkpoint \(expected checkpoint-encoder-N/ and",
    "no configs, heads not inferable": r"cannot infer the encoder's attention heads .*hidden size 32",
}


def assert_failed_cleanly(code, stderr, pattern, out, expected_code=1):
    """Exit code, ONE error line (the last) that matches `pattern`, no traceback, nothing at OUT or beside it."""
    assert code == expected_code, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("hf-ext: error: ")]
    assert len(errors) == 1 and stderr.strip().splitlines()[-1] == errors[0], stderr
    assert re.search(pattern, errors[0]), errors[0]
    assert "Traceback" not in stderr
    assert not out.exists()
    if out.parent.exists():
        assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_SOURCES)
def test_bad_source(case, original, tmp_path, capsys):
    args = break_source(case, original, tmp_path)
    out = tmp_path / "converted"
    code, stderr = run_cli(capsys, "convert", "optimus", *args, out)
    assert_failed_cleanly(code, stderr, BAD_SOURCES[case], out)


@pytest.mark.slow
def test_failure_removes_the_parent_folders_it_created(original, tmp_path, capsys):
    edit_weights(step_folder(original, "decoder") / WEIGHTS_FILE, drop("transformer.ln_f.bias"))
    out = tmp_path / "new" / "deeper" / "converted"
    code, stderr = run_cli(capsys, "convert", "optimus", original, out)
    assert_failed_cleanly(code, stderr, r"missing 1 weight\(s\): decoder\.ln_f\.bias", out)
    assert not (tmp_path / "new").exists()


class RunsCode:
    """Unpickling this runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("target, zip_format", [
    ("decoder weights", False), ("decoder weights", True), ("training args", False), ("training.bin", False),
])
@pytest.mark.slow
def test_pickle_that_would_run_code_is_refused_unexecuted(target, zip_format, original, tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    payload = {"transformer.wte.weight": RunsCode(marker)}
    source = original
    if target == "decoder weights":
        path = step_folder(original, "decoder") / WEIGHTS_FILE
    elif target == "training args":
        path = step_folder(original, "encoder") / ARGS_FILE
        payload = RunsCode(marker)
    else:
        path = source = step_folder(original, "full") / "training.bin"
        payload = {"model_state_dict": payload, "args": RunsCode(marker)}
    torch.save(payload, path, _use_new_zipfile_serialization=zip_format)
    out = tmp_path / "converted"
    code, stderr = run_cli(capsys, "convert", "optimus", source, out)
    assert_failed_cleanly(code, stderr, rf"refusing to load .*{path.name}: it asks to import \S*system", out)
    assert not marker.exists()


@pytest.mark.slow
def test_existing_output_is_kept_unless_overwrite(original, optimus_tiny, tmp_path, capsys):
    out = tmp_path / "converted"
    out.mkdir()
    (out / "keep.txt").write_text("earlier work")
    code, stderr = run_cli(capsys, "convert", "optimus", original, out)
    assert code == 1 and stderr.strip().splitlines()[-1].startswith("hf-ext: error: output")
    assert "already exists (pass --overwrite" in stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # a failing --overwrite run leaves the old folder as it was
    edit_weights(step_folder(original, "encoder") / WEIGHTS_FILE, drop("pooler.dense.bias"))
    code, stderr = run_cli(capsys, "convert", "optimus", original, out, "--overwrite")
    assert code == 1 and "missing 1 weight(s): encoder.pooler.dense.bias" in stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    code, _ = run_cli(capsys, "convert", "optimus", optimus_tiny, out, "--overwrite")
    assert code == 0 and not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".converted.")]


@pytest.mark.slow
def test_unwritable_output(original, tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / "a-file" / "converted"
    code, stderr = run_cli(capsys, "convert", "optimus", original, out)
    assert code == 1 and stderr.strip().splitlines() == [
        f"hf-ext: error: output {out} cannot be created: {tmp_path / 'a-file'} is a file, not a folder"]
    assert (tmp_path / "a-file").read_text() == "not a folder"


@pytest.mark.parametrize("flags, pattern, expected_code", [
    (["--latent-as-gpt-memory", "2"], r"argument --latent-as-gpt-memory: invalid choice: '?2'?", 2),
    (["--step", "7"], r"has no checkpoint for step 7", 1),
    (["--encoder", "ENCODER"], r"give both --encoder and --decoder", 1),
    (["--decoder", "DECODER"], r"give both --encoder and --decoder", 1),
    (["--encoder-tokenizer", "EMPTY"], r"tokenizer folder .*empty-tokenizer has no vocab\.txt", 1),
    (["--decoder-tokenizer", "EMPTY"], r"tokenizer folder .*empty-tokenizer has no vocab\.json and merges\.txt", 1),
], ids=["memory-flag-2", "absent-step", "encoder-only", "decoder-only", "encoder-tokenizer", "decoder-tokenizer"])
@pytest.mark.slow
def test_bad_flags(flags, pattern, expected_code, original, tmp_path, capsys):
    (tmp_path / "empty-tokenizer").mkdir()
    folders = {"ENCODER": step_folder(original, "encoder"), "DECODER": step_folder(original, "decoder"),
               "EMPTY": tmp_path / "empty-tokenizer"}
    flags = [folders.get(flag, flag) for flag in flags]
    source = [] if {"--encoder", "--decoder"} & set(flags) else [original]
    out = tmp_path / "converted"
    code, stderr = run_cli(capsys, "convert", "optimus", *source, out, *flags)
    assert_failed_cleanly(code, stderr, pattern, out, expected_code)
