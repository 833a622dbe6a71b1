"""MT-DNN training on streamed task data (`hf-ext mtdnn train --streaming`, `data.read_task_stream`,
`data.mixed_task_batches`): streamed rows against the map-style reader's, batches of one task mixed at the requested
probabilities, a run stopped and resumed mid-stream against an uninterrupted one, the command line's falling loss and
a shard that stops being JSON, and two processes over gloo reading disjoint parts of the streams with the same loss."""

import json
import re

import pytest
import torch
from conftest import cli_run, run_torchrun
from interrupted_runs import StopAtStep
from streaming_mtdnn import FIRST_ROW_TOKEN, TASKS, RecordingCollator, batch_tasks, row, tiny_config, write_shards

from hf_ext.errors import HfExtError
from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.data import (
    STREAM_COLUMNS,
    MTDNNCollator,
    StreamedBatchCollator,
    load_mtdnn_json,
    mixed_task_batches,
    read_task_stream,
    stream_task_probabilities,
)
from hf_ext.models.mtdnn.training import MTDNNTrainer, train_mtdnn
from hf_ext.trainer import training_arguments


def test_streamed_rows_are_the_map_style_rows_and_bad_rows_are_named(tmp_path):
    config = tiny_config()
    sources = write_shards(tmp_path / "data", shards=2, rows_per_shard=3)
    for task in TASKS:
        whole = tmp_path / f"{task}.jsonl"
        whole.write_text("".join(path.read_text() for path in sorted(sources[task].iterdir())))
        expected = load_mtdnn_json(whole, config, task).select_columns(list(STREAM_COLUMNS))
        assert list(read_task_stream(sources[task], config, task)) == list(expected), task
    bad = tmp_path / "bad.jsonl"
    for text, message in [
            ({**row("cls", 0), "token_id": [2, 999, 3, 3]}, "cls training data, row uid 'cls-0': token id 999 is "
             "outside the model's vocabulary of 160"),
            ({key: value for key, value in row("cls", 0).items() if key != "label"},
             "cls training data, row uid 'cls-0': a training row needs a label")]:
        bad.write_text(json.dumps(text) + "\n")
        with pytest.raises(HfExtError, match=re.escape(message)):
            list(read_task_stream(bad, config, "cls"))
    (tmp_path / "cls.csv").write_text("a,b\n")
    with pytest.raises(HfExtError, match="cls.csv: data files are GLUE .tsv files or the original's preprocessed .json "
                       "lines"):
        read_task_stream(tmp_path / "cls.csv", config, "cls")


def test_streamed_soft_labels_reach_the_batches_as_map_style_rows_give_them(tmp_path):
    """Rows with a `softlabel` (distillation targets written beforehand) keep it through the stream and the mixed
    batches, as `load_mtdnn_json` reads it; a batch whose rows mix soft-labelled and plain ones is refused."""
    config = tiny_config()
    soft = {n: [0.1 * (n % 10), 1 - 0.1 * (n % 10)] for n in range(8)}
    cls_rows = [{**row("cls", n), "softlabel": soft[n]} for n in range(8)]
    source = tmp_path / "cls.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in cls_rows))
    expected = load_mtdnn_json(source, config, "cls").select_columns([*STREAM_COLUMNS, "soft_labels"])
    assert list(read_task_stream(source, config, "cls")) == list(expected)
    plain = write_shards(tmp_path / "plain", shards=1, rows_per_shard=8)
    streams = {"cls": read_task_stream(source, config, "cls"), "sts": read_task_stream(plain["sts"], config, "sts")}
    collate = StreamedBatchCollator(MTDNNCollator())
    seen = set()
    for batch in mixed_task_batches(streams, 4, {"cls": 0.5, "sts": 0.5}, seed=0).take(12):
        padded = collate([batch])
        task = TASKS[int(padded["task"][0])]
        seen.add(task)
        if task == "cls":
            rows = [mark - FIRST_ROW_TOKEN for mark in padded["input_ids"][:, 2].tolist()]  # row n holds its mark
            assert torch.allclose(padded["soft_labels"], torch.tensor([soft[n] for n in rows]))
        else:
            assert "soft_labels" not in padded
    assert seen == {"cls", "sts"}
    source.write_text("".join(json.dumps(r if n % 2 else row("cls", n)) + "\n" for n, r in enumerate(cls_rows)))
    mixed = mixed_task_batches({"cls": read_task_stream(source, config, "cls")}, 4, {"cls": 1.0})
    with pytest.raises(HfExtError, match=re.escape("cls training data: some rows have a softlabel and some do not")):
        next(iter(mixed))


def task_stream(task, index, rows):
    """A stream of `rows` rows of `task` (position `index` in the model) in `read_task_stream`'s columns."""
    from datasets import Dataset

    return Dataset.from_list([{"input_ids": r["token_id"], "token_type_ids": r["type_id"],
                               "attention_mask": [[1] * len(c) for c in r["token_id"]] if task == "rank"
                               else [1] * len(r["token_id"]), "labels": r["label"], "task": index}
                              for r in map(lambda n: row(task, n), range(rows))]).to_iterable_dataset()


@pytest.mark.slow
def test_every_batch_holds_one_task_and_the_mixture_is_within_2_points_of_the_probabilities():
    sizes = {"cls": 7, "sts": 3, "rank": 50}
    streams = {task: task_stream(task, index, sizes[task]) for index, task in enumerate(TASKS)}
    probabilities = {"cls": 0.6, "sts": 0.3, "rank": 0.1}
    collate = StreamedBatchCollator(MTDNNCollator())
    drawn = []
    for batch in mixed_task_batches(streams, 4, probabilities, seed=0).take(5000):
        padded = collate([batch])  # MTDNNCollator refuses a batch of several tasks
        drawn.append(TASKS[int(padded["task"][0])])
        assert padded["task"].tolist() == [batch["task"]] * len(padded["task"])
    assert "labels" in padded and len(padded["task"]) in (1, 2, 3, 4)
    for task, probability in probabilities.items():
        assert abs(drawn.count(task) / len(drawn) - probability) < 0.02, task


def test_task_probabilities_are_the_given_weights_the_sizes_where_known_or_equal_shares():
    from datasets import DatasetInfo, IterableDataset, SplitDict, SplitInfo

    streams = {task: task_stream(task, index, 2) for index, task in enumerate(TASKS)}
    assert stream_task_probabilities(streams) == pytest.approx({"cls": 1 / 3, "sts": 1 / 3, "rank": 1 / 3})
    assert stream_task_probabilities(streams, {"rank": 2, "cls": 1, "sts": 1}) == \
        pytest.approx({"cls": 0.25, "sts": 0.25, "rank": 0.5})
    # the original's ratio: the main (first) task's batches plus 0.5 times as many of the others
    assert stream_task_probabilities(streams, ratio=0.5) == pytest.approx({"cls": 2 / 3, "sts": 1 / 6, "rank": 1 / 6})

    def sized(stream, rows):  # a Hub dataset whose card records its split size
        splits = SplitDict()
        splits.add(SplitInfo("train", num_examples=rows))
        return IterableDataset(stream._ex_iterable, info=DatasetInfo(splits=splits), split="train")

    known = {task: sized(stream, rows) for (task, stream), rows in zip(streams.items(), (100, 300, 600), strict=True)}
    assert stream_task_probabilities(known) == pytest.approx({"cls": 0.1, "sts": 0.3, "rank": 0.6})
    assert stream_task_probabilities(known, ratio=1) == pytest.approx({"cls": 0.5, "sts": 1 / 6, "rank": 1 / 3})
    for given, message in [({"cls": 1, "sts": 1}, "must name each task once"),
                           ({"cls": 1, "sts": 0, "rank": 1}, "must be positive")]:
        with pytest.raises(ValueError, match=message):
            stream_task_probabilities(streams, given)


def test_a_process_whose_part_of_a_task_stream_has_no_rows_is_refused(tmp_path):
    streams = {"cls": task_stream("cls", 0, 2), "sts": task_stream("sts", 1, 2).filter(lambda row: False)}
    with pytest.raises(HfExtError, match="the training data of task sts gives process 0 of 1 no rows"):
        MTDNNTrainer(MTDNNModel(tiny_config()), training_arguments(tmp_path, max_steps=2, use_cpu=True),
                     train_dataset=streams)


def streamed_run(sources, out, callbacks=()):
    config = tiny_config()
    torch.manual_seed(0)
    model = MTDNNModel(config)
    collator = RecordingCollator()
    args = training_arguments(out, max_steps=8, per_device_train_batch_size=3, learning_rate=1e-3, logging_steps=1,
                              save_strategy="steps", save_steps=3, use_cpu=True, disable_tqdm=True, seed=0)
    streams = {task: read_task_stream(source, config, task) for task, source in sources.items()}
    try:
        train_mtdnn(model, streams, args=args, data_collator=collator, callbacks=list(callbacks),
                    task_probabilities={"cls": 2, "sts": 1, "rank": 1})
    except KeyboardInterrupt:
        return collator, None
    return collator, model


@pytest.mark.slow
def test_a_run_resumed_mid_stream_reads_and_trains_what_an_uninterrupted_one_does(tmp_path):
    sources = write_shards(tmp_path / "data", shards=2, rows_per_shard=5)
    whole, expected = streamed_run(sources, tmp_path / "whole")
    trained = batch_tasks(whole.batches[:8])  # the data loader reads one batch ahead
    assert all(len(tasks) == 1 for tasks in trained) and {task for (task,) in trained} == {0, 1, 2}
    streamed_run(sources, tmp_path / "resumed", [StopAtStep(4)])
    checkpoint = tmp_path / "resumed" / "checkpoint-3"
    assert (checkpoint / "stream_state-rank0.json").is_file()
    resumed, model = streamed_run(sources, tmp_path / "resumed")
    # the resumed run reads on from the stream position saved with step 3: the batches 4.. of the whole run
    assert resumed.batches == whole.batches[3:3 + len(resumed.batches)] and len(resumed.batches) >= 5
    state = model.state_dict()
    assert all(torch.equal(tensor, state[name]) for name, tensor in expected.state_dict().items())


@pytest.mark.slow
def test_the_command_streams_shards_with_a_falling_loss_and_resumes_after_a_damaged_shard(tmp_path, capsys):
    sources = write_shards(tmp_path / "data", shards=2, rows_per_shard=60)
    bad = sources["cls"] / "shard-1.jsonl"
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([*lines[:3], '{"uid": "cut', *lines[3:]]) + "\n")
    folder = tmp_path / "model"
    torch.manual_seed(0)
    MTDNNModel(tiny_config()).save_pretrained(folder)
    out = tmp_path / "out"
    argv = ["mtdnn", "train", folder, *(f"--train={task}={source}" for task, source in sources.items()),
            "--streaming", "--max-steps", "80", "--batch-size", "4", "--learning-rate", "1e-2", "--logging-steps",
            "10", "--save-steps", "50", "--task-probabilities", "cls=2", "--task-probabilities", "sts=1",
            "--task-probabilities", "rank=1", "--output-dir", out]
    code, _, err = cli_run(capsys, "--quiet", *argv)
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(rf"hf-ext: error: cannot read the stream: training data {re.escape(str(bad))}, line 4: not "
                         r"JSON \(.+\); the (\d+) steps trained are kept in (.+): correct the data and run the same "
                         "command to resume", last)
    assert code == 1 and match, last
    kept = int(match.group(1))
    checkpoints = tmp_path / "out-checkpoints"
    # cls's first shard holds 60 rows, 15 batches: drawn half the time, they last some 30 steps
    assert 15 <= kept < 80 and match.group(2) == str(checkpoints / f"checkpoint-{kept}")
    assert (checkpoints / f"checkpoint-{kept}" / "stream_state-rank0.json").is_file() and not out.exists()
    bad.write_text("\n".join(lines) + "\n")
    code, stdout, err = cli_run(capsys, "--quiet", *argv)
    assert code == 0, err
    assert json.loads(stdout)["steps"] == 80 and not checkpoints.exists()
    windows = [entry for entry in json.loads((out / "log_history.json").read_text()) if "loss" in entry]
    assert len(windows) == 8 and windows[-1]["loss"] < 0.5 * windows[0]["loss"], windows
    assert all(windows[-1][f"loss_{task}"] < 0.7 * windows[0][f"loss_{task}"] for task in TASKS), windows


@pytest.mark.slow
def test_two_processes_read_disjoint_parts_of_the_streams_with_the_same_loss(tmp_path):
    sources = write_shards(tmp_path / "data")
    ranks, _ = run_torchrun("mtdnn/mtdnn_stream_ddp_train.py", tmp_path / "data", tmp_path)
    assert [rank["world_size"] for rank in ranks] == [2, 2] and ranks[0]["backend"] == "gloo"
    seen = [{tuple(example) for batch in rank["batches"] for example in batch} for rank in ranks]
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert {task for task, _ in seen[0] | seen[1]} == {0, 1, 2} and set(sources) == set(TASKS)
    # every process trains the same task at each step, and the logged loss is the mean over both
    tasks = [batch_tasks(rank["batches"])[:6] for rank in ranks]
    assert tasks[0] == tasks[1] and all(len(batch) == 1 for batch in tasks[0])
    losses = [[entry["loss"] for entry in rank["log_history"] if "loss" in entry] for rank in ranks]
    assert len(losses[0]) == 6 and losses[0] == losses[1]
    assert ranks[0]["weights_checksum"] == ranks[1]["weights_checksum"]
