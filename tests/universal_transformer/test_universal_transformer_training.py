"""Universal Transformer training and evaluation: the algorithmic task generators, the offline accuracy metric, the
Trainer's ponder-cost logging, greedy evaluation of the Universal Transformer and of the vanilla baseline, the halting
map and its plot, LoRA, the `hf-ext universal-transformer` tools and a 2-process torchrun run. Models are tiny."""

import json

import evaluate
import numpy as np
import pytest
import torch
from conftest import cli_exit_code, run_torchrun, torchrun_cli
from fsdp2_training import fsdp2_and_ddp_runs
from peft import PeftModel
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq

from hf_ext import (
    UniversalTransformerForSeq2SeqLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
)
from hf_ext.cli import main
from hf_ext.errors import HfExtError
from hf_ext.lora import add_lora
from hf_ext.metrics import metric_path
from hf_ext.models.universal_transformer import modeling_universal_transformer
from hf_ext.models.universal_transformer.halting_map import halting_map, plot_halting_map
from hf_ext.models.universal_transformer.training import (
    SYMBOLS,
    PositionOffsetCollator,
    algorithmic_config,
    algorithmic_dataset,
    algorithmic_tokenizer,
    count_parameters,
    evaluate_algorithmic,
    teacher_forced_accuracy,
    train_algorithmic,
    vanilla_transformer,
)

pytestmark = pytest.mark.slow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"




def tiny_config(**overrides):
    values = dict(hidden_size=16, num_attention_heads=2, intermediate_size=32, act_max_steps=4, dropout=0.0)
    return algorithmic_config(**{**values, **overrides})


def logged(log_history, key):
    return [entry[key] for entry in log_history if key in entry]


def collate(rows):
    return DataCollatorForSeq2Seq(algorithmic_tokenizer())(
        [{"input_ids": row["input_ids"], "labels": row["labels"]} for row in rows])


def strip_eos(ids):
    ids = list(ids)
    return ids[:ids.index(1)] if 1 in ids else ids


# ----- data ---------------------------------------------------------------------------------------------------------

def expected_target(task, inputs):
    if task == "copy":
        return inputs
    if task == "reverse":
        return inputs[::-1]
    first, second = inputs.split("+")  # lower-endian numbers: the most significant digit is the last
    for number in (first, second):
        assert number and (len(number) == 1 or number[-1] != "0")
    return str(int(first[::-1]) + int(second[::-1]))[::-1]


@pytest.mark.parametrize("task, min_length, max_length", [("copy", 2, 9), ("reverse", 1, 5), ("addition", 3, 12),
                                                          ("addition", 7, 7)])
def test_generators_follow_the_task(task, min_length, max_length):
    dataset = algorithmic_dataset(task, 60, min_length, max_length, seed=3)
    tokenizer = algorithmic_tokenizer()
    assert len(dataset) == 60
    assert set(dataset["length"]) == set(range(min_length, max_length + 1))
    for row in dataset:
        assert row["length"] == len(row["inputs"])
        assert row["targets"] == expected_target(task, row["inputs"])
        # the ids are the tokenizer's, end-of-sequence id 1 appended on both sides (tensor2tensor)
        assert row["input_ids"] == tokenizer(row["inputs"])["input_ids"]
        assert row["labels"] == tokenizer(row["targets"])["input_ids"]
        assert row["input_ids"][-1] == row["labels"][-1] == 1


def test_tokenizer_by_hand(tmp_path):
    tokenizer = algorithmic_tokenizer()
    assert SYMBOLS[:3] == ("<pad>", "</s>", "0")
    assert tokenizer("12+3")["input_ids"] == [3, 4, 12, 5, 1]
    assert tokenizer.decode([3, 4, 12, 5, 1, 0], skip_special_tokens=True) == "12+3"
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (reloaded.pad_token_id, reloaded.eos_token_id) == (0, 1)
    assert reloaded(["907", "1"], padding=True)["input_ids"] == [[11, 2, 9, 1], [3, 1, 0, 0]]


def test_generators_are_seeded():
    first = algorithmic_dataset("reverse", 30, 1, 30, seed=0)
    assert first["inputs"] == algorithmic_dataset("reverse", 30, 1, 30, seed=0)["inputs"]
    assert first["inputs"] != algorithmic_dataset("reverse", 30, 1, 30, seed=1)["inputs"]


@pytest.mark.parametrize("arguments, message", [
    (("sort", 10), "task must be one of"),
    (("copy", 0), "num_examples must be a positive integer"),
    (("copy", 10, 5, 4), "1 <= min_length <= max_length"),
    (("addition", 10, 2, 9), "3 <= min_length"),
    (("copy", 10, 1, True), "max_length must be a positive integer"),
])
def test_generators_refuse_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        algorithmic_dataset(*arguments)


# ----- metric -------------------------------------------------------------------------------------------------------

def test_accuracy_metric_by_hand():
    metric = evaluate.load(metric_path("algorithmic_accuracy"), keep_in_memory=True)  # a local script: offline
    result = metric.compute(predictions=[[1, 2, 3], [4, 5], [7], []], references=[[1, 2, 4], [4, 5], [7, 8], [9]])
    # positions right: 2 + 2 + 1 + 0 of 3 + 2 + 2 + 1; exact: the second only
    assert result == {"char_accuracy": 5 / 8, "sequence_accuracy": 0.25, "num_examples": 4}
    for prediction, reference in (([5, 6, 7], [5, 6]), ([6, 5], [5, 6])):
        metric.add_batch(predictions=[prediction], references=[reference])
    # a prediction running past its reference keeps its char accuracy but is not exact
    assert metric.compute() == {"char_accuracy": 2 / 4, "sequence_accuracy": 0.0, "num_examples": 2}


# ----- Trainer ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def copy_data():
    return algorithmic_dataset("copy", 256, 1, 5, seed=0)


@pytest.fixture(scope="module")
def trained(copy_data, tmp_path_factory):
    torch.manual_seed(0)
    model = UniversalTransformerForSeq2SeqLM(tiny_config(hidden_size=32, intermediate_size=64))
    return train_algorithmic(model, copy_data, tmp_path_factory.mktemp("run"), 150, batch_size=16,
                             learning_rate=5e-3, logging_steps=50, use_cpu=True, disable_tqdm=True)


def test_training_lowers_the_loss_and_logs_the_ponder_cost(trained, copy_data):
    history = trained.state.log_history
    losses = logged(history, "loss")
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0]
    ponder, encoder, decoder = (logged(history, key) for key in
                                ("ponder_cost", "encoder_ponder_cost", "decoder_ponder_cost"))
    assert len(ponder) == len(encoder) == len(decoder) == 3
    assert ponder == pytest.approx([e + d for e, d in zip(encoder, decoder, strict=True)], rel=1e-5)
    # every non-padding position takes 1 to act_max_steps steps and its remainder is below 1
    assert all(1 <= value < 5 for value in encoder + decoder)
    # evaluation reports the ponder cost too: on exactly one batch it is the model's own
    batch = copy_data.select(range(8))
    metrics = trained.evaluate(batch)
    with torch.no_grad():
        outputs = trained.model.eval()(**collate(batch))
    assert metrics["eval_ponder_cost"] == pytest.approx(outputs.ponder_cost.item(), rel=1e-5)
    assert metrics["eval_encoder_ponder_cost"] == pytest.approx(outputs.encoder_ponder_cost.item(), rel=1e-5)
    assert metrics["eval_loss"] == pytest.approx(outputs.loss.item(), rel=1e-5)


def test_baseline_is_same_size_and_logs_no_ponder_cost(copy_data, tmp_path):
    config = tiny_config(act_max_steps=3)
    baseline = vanilla_transformer(config)
    shape = baseline.config
    assert (shape.d_model, shape.encoder_attention_heads, shape.encoder_ffn_dim, shape.encoder_layers,
            shape.decoder_layers, shape.activation_function) == (16, 2, 32, 3, 3, "relu")
    assert vanilla_transformer(config, num_layers=5).config.encoder_layers == 5
    # separate weights per layer: more parameters than the shared-layer Universal Transformer
    assert count_parameters(baseline) > count_parameters(UniversalTransformerForSeq2SeqLM(config))
    trainer = train_algorithmic(baseline, copy_data, tmp_path, 4, batch_size=8, logging_steps=2, use_cpu=True,
                                disable_tqdm=True)
    assert len(logged(trainer.state.log_history, "loss")) == 2
    assert not logged(trainer.state.log_history, "ponder_cost")
    with pytest.raises(ValueError, match="key and value depths"):
        vanilla_transformer(tiny_config(attention_value_depth=8))


# ----- positions at random offsets ---------------------------------------------------------------------------------

def test_position_offset_collator_left_pads_each_side_by_its_own_offset():
    features = [{"input_ids": [3, 4, 1], "labels": [4, 3, 1]}, {"input_ids": [5, 1], "labels": [5, 1]}]
    batch = PositionOffsetCollator(4, seed=1)(features)
    rng = np.random.default_rng(1)  # the collator's draws: an encoder and a decoder offset per example
    for row, feature in enumerate(features):
        encoder_offset, decoder_offset = (int(k) for k in rng.integers(0, 4, size=2))
        inputs, labels = feature["input_ids"], feature["labels"]
        width = batch["input_ids"].shape[1]
        assert batch["input_ids"][row].tolist() == ([0] * encoder_offset + inputs + [0] * width)[:width]
        assert batch["attention_mask"][row].tolist() == (
            [0] * encoder_offset + [1] * len(inputs) + [0] * width)[:width]
        width = batch["labels"].shape[1]
        # the decoder input is the labels shifted right behind the start id (0), after the offset's padding
        assert batch["decoder_input_ids"][row].tolist() == ([0] * (decoder_offset + 1) + labels[:-1] + [0] * width)[
            :width]
        assert batch["decoder_attention_mask"][row].tolist() == (
            [0] * decoder_offset + [1] * len(labels) + [0] * width)[:width]
        assert batch["labels"][row].tolist() == ([-100] * decoder_offset + labels + [-100] * width)[:width]
    with pytest.raises(ValueError, match="at least 1"):
        PositionOffsetCollator(0)


def test_left_padding_moves_the_universal_transformer_to_later_positions(monkeypatch):
    """An example behind k pads gets the logits of the same example whose position signal starts at k."""
    torch.manual_seed(0)
    model = UniversalTransformerForSeq2SeqLM(tiny_config()).eval()
    inputs, labels = [3, 7, 2, 9, 1], [4, 6, 1]
    batch = PositionOffsetCollator(1)([{"input_ids": inputs, "labels": labels}])  # offsets 0: no padding
    with torch.no_grad():
        padded = model(input_ids=torch.tensor([[0, 0, 0] + inputs]), attention_mask=torch.tensor([[0] * 3 + [1] * 5]),
                       decoder_input_ids=torch.tensor([[0, 0] + [0] + labels[:-1]]),
                       decoder_attention_mask=torch.tensor([[0, 0] + [1] * 3])).logits[0, 2:]
        unshifted = model(**batch).logits[0]
        timing_signal = modeling_universal_transformer.timing_signal
        # the encoder's signal starts at 3 and the decoder's at 2: tell them apart by their length
        monkeypatch.setattr(modeling_universal_transformer, "timing_signal", lambda length, *rest: timing_signal(
            length + (3 if length == len(inputs) else 2), *rest)[-length:])
        shifted = model(**batch).logits[0]
    torch.testing.assert_close(padded, shifted, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(padded, unshifted, atol=1e-3)


def test_position_offsets_train_the_universal_transformer_only(copy_data, tmp_path):
    torch.manual_seed(0)
    model = UniversalTransformerForSeq2SeqLM(tiny_config())
    trainer = train_algorithmic(model, copy_data, tmp_path, 4, batch_size=8, logging_steps=2, position_offsets=5,
                                use_cpu=True, disable_tqdm=True)
    assert isinstance(trainer.data_collator, PositionOffsetCollator) and trainer.data_collator.max_offset == 5
    assert len(logged(trainer.state.log_history, "loss")) == 2
    with pytest.raises(ValueError, match="only the Universal Transformer"):
        train_algorithmic(vanilla_transformer(tiny_config()), copy_data, tmp_path, 4, position_offsets=5)


# ----- teacher-forced evaluation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("architecture", ["universal-transformer", "transformer"])
def test_teacher_forced_accuracy_counts_argmax_matches_of_every_target_position(architecture, trained):
    if architecture == "universal-transformer":
        model = trained.model
    else:
        torch.manual_seed(0)
        model = vanilla_transformer(tiny_config())
    dataset = algorithmic_dataset("copy", 11, 1, 9, seed=5)
    correct = total = exact = 0
    with torch.no_grad():
        for row in dataset:  # one example at a time: no padding
            labels = torch.tensor([row["labels"]])
            predicted = model.eval()(input_ids=torch.tensor([row["input_ids"]]), labels=labels).logits.argmax(-1)
            matches = int((predicted == labels).sum())  # the end-of-sequence id counts, as in tensor2tensor
            correct, total, exact = correct + matches, total + labels.numel(), exact + (matches == labels.numel())
    result = teacher_forced_accuracy(model, dataset, batch_size=4)
    assert result == {"char_accuracy": pytest.approx(correct / total), "sequence_accuracy": exact / 11,
                      "num_examples": 11}
    if architecture == "universal-transformer":  # trained on copy: most next symbols at training lengths are right
        assert teacher_forced_accuracy(model, algorithmic_dataset("copy", 20, 1, 5, seed=6))["char_accuracy"] > 0.6


# ----- greedy evaluation --------------------------------------------------------------------------------------------

def one_at_a_time(model, dataset):
    """Char and sequence accuracy from unbatched greedy generation, counted by hand."""
    correct = total = exact = 0
    with torch.no_grad():
        for row in dataset:
            ids = torch.tensor([row["input_ids"]])
            output = model.generate(input_ids=ids, max_new_tokens=ids.shape[1] + 1, do_sample=False, num_beams=1)
            prediction, reference = strip_eos(output[0, 1:].tolist()), strip_eos(row["labels"])
            correct += sum(p == r for p, r in zip(prediction, reference, strict=False))
            total += len(reference)
            exact += prediction == reference
    return correct / total, exact / len(dataset)


@pytest.mark.parametrize("architecture", ["universal-transformer", "transformer"])
def test_batched_greedy_evaluation_equals_one_example_at_a_time(architecture, trained):
    if architecture == "universal-transformer":
        model = trained.model
    else:
        torch.manual_seed(0)
        model = vanilla_transformer(tiny_config())
    model.eval()
    dataset = algorithmic_dataset("copy", 11, 1, 9, seed=5)  # lengths past the training range too
    result = evaluate_algorithmic(model, dataset, batch_size=4)  # batches padded to their longest input
    char_accuracy, sequence_accuracy = one_at_a_time(model, dataset)
    assert result["num_examples"] == 11
    assert result["char_accuracy"] == pytest.approx(char_accuracy)
    assert result["sequence_accuracy"] == pytest.approx(sequence_accuracy)
    if architecture == "universal-transformer":  # 150 steps on copy get most characters of training lengths right
        seen = evaluate_algorithmic(model, algorithmic_dataset("copy", 20, 1, 5, seed=6))
        assert seen["char_accuracy"] > 0.6


# ----- halting map --------------------------------------------------------------------------------------------------

def test_halting_map_values_and_plot(trained, tmp_path):
    model, tokenizer = trained.model.eval(), algorithmic_tokenizer()
    encoder_row, decoder_row = halting_map(model, tokenizer, "31415")
    input_ids = torch.tensor([tokenizer("31415")["input_ids"]])
    with torch.no_grad():
        generated = model.generate(input_ids=input_ids, max_new_tokens=7, do_sample=False)
        outputs = model(input_ids=input_ids, decoder_input_ids=generated[:, :-1])
    assert (encoder_row.side, encoder_row.tokens) == ("encoder", [*"31415", "</s>"])
    assert encoder_row.ponder_time == pytest.approx(
        (outputs.encoder_n_updates + outputs.encoder_remainders)[0].tolist())
    # each decoder position is labelled with the token it predicts
    assert decoder_row.tokens == tokenizer.convert_ids_to_tokens(generated[0, 1:].tolist())
    assert decoder_row.ponder_time == pytest.approx(
        (outputs.decoder_n_updates + outputs.decoder_remainders)[0].tolist())
    assert len({round(value, 3) for value in encoder_row.ponder_time + decoder_row.ponder_time}) > 1

    from matplotlib.image import imread

    short = plot_halting_map([encoder_row, decoder_row], tmp_path / "map.png")
    assert short.read_bytes()[:8] == PNG_SIGNATURE
    image = imread(short)
    assert image.shape[2] in (3, 4) and image[..., :3].std() > 0.05  # a drawn map, not a blank canvas
    long = plot_halting_map(halting_map(model, tokenizer, "2718281828459045"), tmp_path / "long.png")
    assert imread(long).shape[1] > image.shape[1]  # one column per position


def test_halting_map_of_an_encoder_and_refusals(tmp_path):
    tokenizer = algorithmic_tokenizer()
    torch.manual_seed(0)
    encoder = UniversalTransformerModel(tiny_config()).eval()
    (row,) = halting_map(encoder, tokenizer, "999")
    with torch.no_grad():
        outputs = encoder(input_ids=torch.tensor([[11, 11, 11, 1]]))
    assert row.ponder_time == pytest.approx((outputs.n_updates + outputs.remainders)[0].tolist())
    with pytest.raises(HfExtError, match="ACT switched off"):
        halting_map(UniversalTransformerModel(tiny_config(use_act=False)), tokenizer, "12")
    with pytest.raises(HfExtError, match="needs a Universal Transformer"):
        halting_map(vanilla_transformer(tiny_config()), tokenizer, "12")
    with pytest.raises(HfExtError, match="cannot tokenize '1x2'"):
        halting_map(encoder, tokenizer, "1x2")
    with pytest.raises(HfExtError, match="no positions"):
        plot_halting_map([], tmp_path / "empty.png")
    assert not (tmp_path / "empty.png").exists()


# ----- LoRA ---------------------------------------------------------------------------------------------------------

def test_lora_seq2seq_trains_saves_and_reloads(copy_data, tmp_path):
    torch.manual_seed(0)
    model = add_lora(UniversalTransformerForSeq2SeqLM(tiny_config()), r=4)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert all("lora_" in name or "modules_to_save" in name for name in trainable)
    for target in ("layer.self_attn.q_proj", "layer.self_attn.v_proj", "layer.cross_attn.o_proj",
                   "layer.transition.fc1", "layer.transition.fc2"):
        assert any(target in name and "lora_A" in name for name in trainable), target
    assert {side for side in ("encoder", "decoder") for name in trainable
            if f"{side}.halting.modules_to_save" in name} == {"encoder", "decoder"}
    trainer = train_algorithmic(model, copy_data, tmp_path / "run", 30, batch_size=16, learning_rate=1e-2,
                                logging_steps=10, use_cpu=True, disable_tqdm=True)
    losses = logged(trainer.state.log_history, "loss")
    assert losses[-1] < losses[0]
    assert logged(trainer.state.log_history, "ponder_cost")
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if name in frozen)
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

    torch.manual_seed(0)  # the same base weights
    reloaded = PeftModel.from_pretrained(UniversalTransformerForSeq2SeqLM(tiny_config()), tmp_path / "adapter")
    batch = collate(copy_data.select(range(6)))
    model.eval()
    reloaded.eval()
    with torch.no_grad():
        expected, actual = model(**batch), reloaded(**batch)
        assert torch.equal(expected.logits, actual.logits)
        assert torch.equal(expected.encoder_n_updates, actual.encoder_n_updates)
        assert torch.equal(expected.decoder_remainders, actual.decoder_remainders)
        generated = [m.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                max_new_tokens=7, do_sample=False) for m in (model, reloaded)]
    assert torch.equal(*generated)


def test_lora_classifier_with_conv_transition(tmp_path):
    torch.manual_seed(0)
    base = UniversalTransformerForSequenceClassification(tiny_config(transition="conv", num_labels=3))
    model = add_lora(base, r=2)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert any("transition.conv1.lora_A" in name for name in trainable)
    assert any("classifier.modules_to_save" in name for name in trainable)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(2, 12, (12, 6), generator=generator)
    labels = inputs[:, 0] % 3  # learnable from the first digit
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    losses = []
    for _ in range(15):
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    model.save_pretrained(tmp_path)
    torch.manual_seed(0)
    fresh = UniversalTransformerForSequenceClassification(tiny_config(transition="conv", num_labels=3))
    reloaded = PeftModel.from_pretrained(fresh, tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=inputs).logits, reloaded(input_ids=inputs).logits)


# ----- command line -------------------------------------------------------------------------------------------------

TINY_CLI = ["--hidden-size", "16", "--num-heads", "2", "--intermediate-size", "32", "--act-max-steps", "4",
            "--num-train", "64", "--num-test", "8", "--max-steps", "8", "--logging-steps", "4"]


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "addition"
    code = main(["universal-transformer", "train-algorithmic", "--task", "addition", "--output-dir", str(out),
                 "--train-length", "6", "--test-length", "9", "--seed", "4", *TINY_CLI])
    assert code == 0
    return out


def test_cli_train_algorithmic_saves_a_model_that_reproduces_its_results(cli_model):
    results = json.loads((cli_model / "results.json").read_text())
    assert (results["task"], results["architecture"], results["train_length"], results["test_length"]) == (
        "addition", "universal-transformer", 6, 9)
    assert len(logged(json.loads((cli_model / "log_history.json").read_text()), "ponder_cost")) == 2
    model = AutoModelForSeq2SeqLM.from_pretrained(cli_model)
    assert AutoTokenizer.from_pretrained(cli_model)("12+3")["input_ids"] == [3, 4, 12, 5, 1]
    # the folder runs the text-to-text pipeline (tests/universal_transformer/test_universal_transformer_pipeline.py)
    assert list(json.loads((cli_model / "config.json").read_text())["custom_pipelines"]) == \
        ["universal-transformer-text2text"]
    assert (cli_model / "pipeline_universal_transformer.py").is_file()
    # the longer test set is the one run_algorithmic draws: lengths 7-9, seed + 2
    longer = algorithmic_dataset("addition", 8, 7, 9, seed=6)
    assert evaluate_algorithmic(model, longer) == results["longer_lengths"]


@pytest.mark.slow
def test_cli_under_torchrun_writes_its_output_once_from_the_main_process(tmp_path):
    """`hf-ext universal-transformer train-algorithmic` under `torchrun --nproc-per-node 2`: both processes end with
    exit code 0 and only the main one writes the output folder, once, with one summary line; the folder holds the
    trained model (its weights moved from the seed's start) that reproduces the recorded accuracies."""
    out = tmp_path / "out"
    code, stdout, err = torchrun_cli(["universal-transformer", "train-algorithmic", "--task", "addition",
                                      "--output-dir", out, "--train-length", "6", "--test-length", "9", "--seed", "4",
                                      "--device", "cpu", *TINY_CLI], timeout=600)
    assert code == 0, err[-3000:]
    [summary] = [json.loads(line) for line in stdout.splitlines()]
    assert summary["output_dir"] == str(out) and summary["architecture"] == "universal-transformer"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]  # no other process's staging folder
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert json.loads((out / "results.json").read_text())["longer_lengths"] == summary["longer_lengths"] == \
        evaluate_algorithmic(model, algorithmic_dataset("addition", 8, 7, 9, seed=6))
    torch.manual_seed(4)
    untrained = UniversalTransformerForSeq2SeqLM(model.config).state_dict()
    assert any(not torch.equal(weight, untrained[name]) for name, weight in model.state_dict().items())


def test_cli_halting_map(cli_model, tmp_path, capsys):
    capsys.readouterr()
    assert main(["universal-transformer", "halting-map", str(cli_model), "21+43", str(tmp_path / "map.png")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (tmp_path / "map.png").read_bytes()[:8] == PNG_SIGNATURE
    rows = halting_map(AutoModelForSeq2SeqLM.from_pretrained(cli_model), algorithmic_tokenizer(), "21+43")
    assert [row["side"] for row in printed["rows"]] == ["encoder", "decoder"]
    for row, expected in zip(printed["rows"], rows, strict=True):
        assert row["tokens"] == expected.tokens
        assert row["ponder_time"] == pytest.approx(expected.ponder_time)


@pytest.mark.parametrize("arguments, message", [
    (["--task", "copy", "--train-length", "9", "--test-length", "9"], "--test-length must exceed --train-length"),
    (["--task", "addition", "--train-length", "2"], "addition needs --train-length of at least 3"),
    (["--task", "copy", "--max-steps", "0"], "argument --max-steps: must be at least 1"),
    (["--task", "copy", "--hidden-size", "18", "--num-heads", "4"], "divisible by --num-heads"),
    (["--task", "copy", "--dropout", "1.5"], "argument --dropout: must be in [0, 1)"),
])
def test_cli_train_refuses_bad_arguments(arguments, message, tmp_path, capsys):
    out = tmp_path / "out"
    usage_error = message.startswith("argument ")  # argparse's own checks exit with 2
    assert cli_exit_code(["universal-transformer", "train-algorithmic", "--output-dir", str(out), *arguments]) == \
        (2 if usage_error else 1)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hf-ext: error: ") and message in lines[0], lines
    assert not out.exists()


def test_cli_train_refuses_an_existing_output(cli_model, capsys):
    before = sorted(p.name for p in cli_model.iterdir())
    assert main(["universal-transformer", "train-algorithmic", "--task", "copy", "--output-dir", str(cli_model)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert sorted(p.name for p in cli_model.iterdir()) == before


def test_cli_halting_map_refuses_bad_input(cli_model, tmp_path, capsys):
    no_act = tmp_path / "no_act"
    UniversalTransformerModel(tiny_config(use_act=False)).save_pretrained(no_act)
    algorithmic_tokenizer().save_pretrained(no_act)
    no_tokenizer = tmp_path / "no_tokenizer"
    UniversalTransformerModel(tiny_config()).save_pretrained(no_tokenizer)
    cases = [
        ([str(cli_model), "1x", str(tmp_path / "a.png")], "cannot tokenize '1x'"),
        ([str(no_act), "12", str(tmp_path / "b.png")], "ACT switched off"),
        ([str(no_tokenizer), "12", str(tmp_path / "c.png")], "has no tokenizer: save one into the folder"),
        ([str(cli_model), "12", str(tmp_path / "nowhere" / "e.png")], "does not exist"),
    ]
    for arguments, message in cases:
        capsys.readouterr()
        assert main(["universal-transformer", "halting-map", *arguments]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hf-ext: error:") and message in lines[0], lines
    # a path that names no folder is a usage error, found before any model is loaded
    assert cli_exit_code(["universal-transformer", "halting-map", tmp_path / "missing", "12", tmp_path / "d.png"]) == 2
    assert "argument model: no folder named" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.png"))


# ----- two processes ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_process_training_with_different_halting_per_rank(tmp_path):
    # a deadlock (ranks running different numbers of collectives) would hang: the timeout turns it into a failure
    ranks, run = run_torchrun("universal_transformer/universal_transformer_ddp_train.py", tmp_path)
    for result in ranks:
        assert (result["world_size"], result["global_step"], result["backend"]) == (2, 8, "gloo")
        assert len(result["loop_steps"]["encoder"]) == len(result["loop_steps"]["decoder"]) == 8
    # the ACT loops stopped after different numbers of steps on the two ranks, yet the run went through ...
    steps = [ranks[rank]["loop_steps"]["encoder"] for rank in (0, 1)]
    assert any(a != b for a, b in zip(*steps, strict=True))
    # ... and DDP kept the replicas identical, with the logged ponder cost averaged over both ranks
    assert ranks[0]["weights_checksum"] == ranks[1]["weights_checksum"]
    assert logged(ranks[0]["log_history"], "ponder_cost") == logged(ranks[1]["log_history"], "ponder_cost")
    assert len(logged(ranks[0]["log_history"], "ponder_cost")) == 4


@pytest.mark.slow
def test_fsdp2_training_through_accelerate_matches_ddp(tmp_path):
    """`train_algorithmic` (the Trainer of `hf-ext universal-transformer train`) under 2 processes over gloo, sharded
    by accelerate's FSDP2 plan with the settings of docs/launch/accelerate_fsdp2_gpu.yaml: a unit per stack, the
    shared embedding and the softmax in one unit, every parameter sharded, the tie kept; the run trains exactly as DDP
    does on the same batches (losses and weights within float rounding)."""
    runs, _ = fsdp2_and_ddp_runs("universal_transformer/universal_transformer_fsdp2_train.py", out=tmp_path)
    fsdp2 = runs["fsdp2"]
    assert fsdp2["units"] == ["", "decoder", "embed_tokens", "encoder", "lm_head"]
    assert runs["ddp"]["tied"] and fsdp2["tied"]
    losses = fsdp2["losses"]
    assert len(losses) == 6 and losses[-1] < 0.9 * losses[0]
