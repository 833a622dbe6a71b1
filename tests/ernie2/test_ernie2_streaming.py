"""ERNIE 2.0 pre-training on streamed corpora (`hf_ext.streaming`, `read_documents(..., streaming=True)`): sources
(file, folder of shards, glob), a stage's task mixture against its requested shares, a stage stopped and resumed
mid-stream against an uninterrupted one, a shard that stops being JSON halfway (in one process, and in one of two
processes under torchrun, where every process must end within seconds), and two processes (one machine; two "nodes"
through a c10d rendezvous) reading disjoint parts of the stream with the same loss."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROCESS_TIMEOUT, REPO_ROOT, cli_run, run_torchrun, torchrun_cli
from interrupted_runs import StopAtStep
from streaming_corpus import RecordingCollator, tiny_config, tokenizer, write_corpus
from transformers import TrainingArguments

from hf_ext.errors import HfExtError
from hf_ext.models.ernie2 import Ernie2ForPreTraining
from hf_ext.models.ernie2.data import read_documents, stage_mixture, task_streams
from hf_ext.models.ernie2.schedule import ContinualSchedule, Stage
from hf_ext.streaming import data_files

HERE = Path(__file__).parent
FIRST_WORD_ID = 16  # word0 in streaming_corpus.tokenizer(): ids from here on mark documents


def document_words(seen):
    """The documents' own words in the capitalization examples (knowledge masking puts random words in)."""
    return {piece for task, ids in seen if task == "capitalization" for piece in ids if piece >= FIRST_WORD_ID}


def test_sources_are_a_file_a_folder_of_shards_or_a_glob(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", shards=3)
    shards = [str(corpus / f"shard-0{i}.jsonl") for i in range(3)]
    assert data_files(shards[1], "documents") == [shards[1]]
    assert data_files(corpus, "documents") == shards
    assert data_files(str(corpus / "shard-0[02].jsonl"), "documents") == [shards[0], shards[2]]
    assert data_files("someone/corpus", "documents") is None  # a Hub dataset id
    (tmp_path / "empty").mkdir()
    for source, message in [(tmp_path / "empty", "holds no shards"), (corpus / "*.txt", "no documents shard matches"),
                            (tmp_path / "gone.jsonl", "documents file .*gone.jsonl does not exist")]:
        with pytest.raises(HfExtError, match=message):
            data_files(source, "documents")
    streamed = read_documents(corpus, streaming=True)
    assert streamed.n_shards == 3
    assert [row["paragraphs"][0][0] for row in streamed] == [
        f"The river flows past word{i} town." for i in range(18)]


@pytest.mark.slow
def test_a_stage_mixes_its_tasks_at_the_requested_shares():
    from datasets import Dataset

    streams = {task: Dataset.from_dict({"task": [task] * size}).to_iterable_dataset()
               for task, size in (("knowledge_masking", 7), ("capitalization", 3), ("sentence_distance", 50))}
    stage = Stage({"knowledge_masking": 60, "capitalization": 30, "sentence_distance": 10})
    drawn = [row["task"] for row in stage_mixture(streams, stage, seed=0).take(5000)]
    for task, steps in stage.steps.items():
        assert abs(drawn.count(task) / len(drawn) - steps / stage.total_steps) < 0.02, task
    with pytest.raises(HfExtError, match="no examples for task"):
        stage_mixture({"capitalization": streams["capitalization"]}, stage)


def streamed_stage(corpus, out, callbacks=None):
    from hf_ext.models.ernie2.training import continual_pretraining

    tok = tokenizer()
    config = tiny_config(len(tok))
    schedule = ContinualSchedule.from_dict({"stages": [
        {"steps": {"knowledge_masking": 4, "capitalization": 2, "sentence_distance": 2}}]})
    streams = task_streams(tok, config, schedule, read_documents(corpus, streaming=True), max_length=32)
    torch.manual_seed(0)
    collator = RecordingCollator(config)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=3, logging_steps=1, use_cpu=True,
                             save_strategy="steps", save_steps=3, report_to=[], disable_tqdm=True, seed=0)
    try:
        model, histories = continual_pretraining(Ernie2ForPreTraining(config), schedule, streams, args,
                                                 data_collator=collator, callbacks=callbacks)
    except KeyboardInterrupt:
        return collator.seen, None, None
    return collator.seen, model, histories


@pytest.mark.slow
def test_a_stage_resumed_mid_stream_reads_and_trains_what_an_uninterrupted_one_does(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    expected_seen, expected, _ = streamed_stage(corpus, tmp_path / "whole")
    streamed_stage(corpus, tmp_path / "resumed", [StopAtStep(4)])
    checkpoint = tmp_path / "resumed" / "stage-1" / "checkpoint-3"
    assert (checkpoint / "stream_state-rank0.json").is_file()
    seen, model, _ = streamed_stage(corpus, tmp_path / "resumed")
    # the resumed run starts reading at the stream position saved with step 3: batches 4.. of the whole run
    assert seen == expected_seen[3 * 3:][:len(seen)] and len(seen) >= 5 * 3
    state = model.state_dict()
    assert all(torch.equal(tensor, state[name]) for name, tensor in expected.state_dict().items())


@pytest.mark.slow
def test_a_shard_that_stops_being_json_is_named_and_the_steps_trained_are_kept(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", shards=2, documents_per_shard=70)
    bad = corpus / "shard-01.jsonl"
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([*lines[:3], '{"paragraphs": [["cut', *lines[3:]]) + "\n")
    folder = tmp_path / "model"
    config = tiny_config(len(tokenizer()))
    Ernie2ForPreTraining(config).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    stages = tmp_path / "stages.yml"
    stages.write_text("stages:\n  - steps: {capitalization: 80}\n")
    argv = ["ernie2", "pretrain", folder, "--documents", corpus, "--streaming", "--stages", stages, "--output-dir",
            tmp_path / "run", "--batch-size", "2", "--max-length", "32", "--save-steps", "100"]
    code, _, err = cli_run(capsys, "--quiet", *argv)
    stage = tmp_path / "run" / "stage-1"
    # the first 64 documents (one map batch) give 128 examples, 64 steps of 2; the next batch reaches shard 1
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(rf"hf-ext: error: cannot read the stream: documents {re.escape(str(bad))}, line 4: not JSON "
                         r"\(Unterminated string starting at\); the (\d+) steps trained are kept in (.+): correct the "
                         "data and run the same command to resume", last)
    assert code == 1 and match, last
    kept = int(match.group(1))
    assert 0 < kept <= 64 and match.group(2) == str(stage / f"checkpoint-{kept}")
    assert (stage / f"checkpoint-{kept}" / "stream_state-rank0.json").is_file()
    assert not (tmp_path / "run" / "ernie").exists()
    bad.write_text("\n".join(lines) + "\n")
    code, out, err = cli_run(capsys, "--quiet", *argv)
    assert code == 0, err
    assert json.loads(out)["step"] == 80 and (tmp_path / "run" / "ernie").is_dir()


@pytest.mark.slow
def test_two_processes_read_disjoint_parts_of_the_stream_with_the_same_loss(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    ranks, _ = run_torchrun("ernie2/ernie2_stream_ddp_train.py", corpus, tmp_path)
    assert [rank["world_size"] for rank in ranks] == [2, 2] and ranks[0]["backend"] == "gloo"
    words = [document_words(rank["seen"]) for rank in ranks]
    assert words[0] and words[1] and not words[0] & words[1]
    losses = [[entry["loss"] for entry in rank["log_history"] if "loss" in entry] for rank in ranks]
    assert len(losses[0]) == 4 and losses[0] == losses[1]


@pytest.mark.slow
def test_two_nodes_meet_at_a_c10d_rendezvous_and_read_disjoint_shards(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ernie2-stream",
               str(HERE / "ernie2_stream_ddp_train.py"), str(corpus), str(tmp_path)]
    nodes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for node in nodes:
        _, stderr = node.communicate(timeout=PROCESS_TIMEOUT)
        assert node.returncode == 0, stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(rank["node_rank"] for rank in ranks) == [0, 1] and ranks[0]["world_size"] == 2
    words = [document_words(rank["seen"]) for rank in ranks]
    assert words[0] and words[1] and not words[0] & words[1]
    assert [e["loss"] for e in ranks[0]["log_history"] if "loss" in e] == \
        [e["loss"] for e in ranks[1]["log_history"] if "loss" in e]


@pytest.mark.slow
def test_a_damaged_shard_read_by_one_of_two_processes_ends_every_process_with_one_error_line(tmp_path):
    # four shards: rank 1 reads shards 2 and 3; the first 64 documents of shard 2 train it 64 steps of 2, then
    # shard 3, whose fifth line is cut, is read
    corpus = write_corpus(tmp_path / "corpus", shards=4, documents_per_shard=70)
    bad = corpus / "shard-03.jsonl"
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([*lines[:4], '{"paragraphs": [["cut', *lines[4:]]) + "\n")
    folder = tmp_path / "model"
    Ernie2ForPreTraining(tiny_config(len(tokenizer()))).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    stages = tmp_path / "stages.yml"
    stages.write_text("stages:\n  - steps: {capitalization: 100}\n")
    argv = ["ernie2", "pretrain", folder, "--documents", corpus, "--streaming", "--stages", stages, "--output-dir",
            tmp_path / "run", "--batch-size", "2", "--max-length", "32", "--save-steps", "20", "--logging-steps", "10",
            "--device", "cpu"]
    code, _, err = torchrun_cli(argv, timeout=300)
    stage = tmp_path / "run" / "stage-1"
    errors = [line for line in err.splitlines() if line.startswith("hf-ext: error:")]
    named = [line for line in errors if re.fullmatch(
        rf"hf-ext: error: cannot read the stream: documents {re.escape(str(bad))}, line 5: not JSON \(.+\); the "
        rf"steps up to {re.escape(str(stage / 'checkpoint-60'))} are kept \(several processes save only every "
        r"--save-steps, not on failure\): correct the data and run the same command to resume", line)]
    assert code != 0 and len(named) == 1, err[-3000:]
    # the other process, whose step lost its peer, says so in one line, or is stopped by torchrun; no rank's
    # traceback is printed
    assert set(errors) - set(named) <= {"hf-ext: error: another process of this distributed run stopped (its own "
                                        "error line says why)", "hf-ext: error: terminated (SIGTERM)"}, errors
    assert not re.search(r"^\[rank\d\]:", err, re.MULTILINE)
    # torchrun's report: both processes failed (exit code 1, or stopped by its SIGTERM), within seconds of each other
    codes = [int(c) for c in re.findall(r"^ +exitcode +: (-?\d+)", err, re.MULTILINE)]
    times = sorted(re.findall(r"^ +time +: \S+_(\d\d):(\d\d):(\d\d)$", err, re.MULTILINE))
    seconds = [int(h) * 3600 + int(m) * 60 + int(s) for h, m, s in times]
    assert len(codes) == 2 and 0 not in codes and seconds[-1] - seconds[0] <= 5, err[-3000:]
    # no half-written folder: the checkpoints kept hold every process's state, and no model was written
    checkpoints = sorted(stage.glob("checkpoint-*"))
    assert [path.name for path in checkpoints] == ["checkpoint-40", "checkpoint-60"]
    assert all((path / name).is_file() for path in checkpoints
               for name in ("trainer_state.json", "stream_state-rank0.json", "stream_state-rank1.json"))
    assert not (tmp_path / "run" / "ernie").exists()

    bad.write_text("\n".join(lines) + "\n")
    code, out, err = torchrun_cli(argv, timeout=300)
    assert code == 0, err[-3000:]
    logged = [json.loads(line)["step"] for line in err.splitlines() if line.startswith('{"step"')]
    assert min(logged) == 70 and json.loads(out)["step"] == 100  # resumed from step 60; printed by one process
    assert (tmp_path / "run" / "ernie" / "model.safetensors").is_file()
