"""`hf-ext convert mtdnn` on checkpoints the original wrote with other encoders (issue 26 item 2): parity with the
original code's outputs on the RoBERTa, DeBERTa (v1) and ELECTRA fixtures (`tests/fixtures/mtdnn/<encoder>/`, written
by the original train.py, see tests/fixtures/README.md) for every task, loading with and without hf-ext, and other
configurations of those encoders written in the original's checkpoint format. Nothing here depends on a fixture's
sizes, ids or task names: they are read from its reference.json."""

import json
import runpy
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
import torch
import transformers
from safetensors.torch import load_file
from test_mtdnn_conversion import (
    ORIGINAL,
    assert_matches,
    original_outputs,
    original_task_def,
    pair_batch,
    run_cli,
    write_original_checkpoint,
)
from transformers import AutoModel

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.models.mtdnn import MTDNNModel

FIXTURES = ["roberta", "deberta", "electra"]


@pytest.fixture(scope="module", params=FIXTURES)
def fixture(request, fixtures_dir):
    folder = fixtures_dir / "mtdnn" / request.param
    return folder, load_file(str(folder / "reference.safetensors")), json.loads((folder / "reference.json").read_text())


def group_size_arguments(meta):
    """--group-size for the ranking tasks (the checkpoint does not store K; the fixture's reference.json does)."""
    return [argument for task in meta["tasks"] if "pairwise_size" in task
            for argument in ("--group-size", f"{task['name']}={task['pairwise_size']}")]


@pytest.fixture(scope="module")
def converted(fixture, repo_root, tmp_path_factory):
    """The fixture's model_0.pt converted by the conversion/ script, checked against its reference on the way."""
    folder, _, meta = fixture
    out = tmp_path_factory.mktemp(f"mtdnn_{meta['fixture']}") / "converted"
    script = repo_root / "conversion" / "convert_mtdnn_original_checkpoint.py"
    argv = [str(script), str(folder / "model_0.pt"), str(out), "--reference", str(folder / "reference.safetensors"),
            *group_size_arguments(meta)]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    return out


def inputs_of(tensors, name):
    return {key: tensors[f"{name}.{key}"] for key in ("input_ids", "token_type_ids", "attention_mask")}


def test_every_task_matches_the_original(fixture, converted):
    _, tensors, meta = fixture
    model = AutoModel.from_pretrained(converted).eval()
    assert isinstance(model, MTDNNModel)
    assert model.config.encoder.model_type == meta["fixture"]
    assert model.config.task_names == [task["name"] for task in meta["tasks"]]
    assert type(model.bert).__name__.lower() == f"{meta['fixture']}model"  # RobertaModel, DebertaModel, ...
    for task in meta["tasks"]:
        name = task["name"]
        inputs = inputs_of(tensors, name)
        real = inputs["attention_mask"].bool()
        assert not real.all(), f"{name}: the fixture should have a padded row"
        with torch.no_grad():
            out = model(**inputs, task=task["task_id"], labels=tensors[f"{name}.labels"], output_hidden_states=True)
        assert_matches(out.logits, tensors[f"{name}.logits"])
        # every real token of every layer (padded positions are not read by any head, and DeBERTa's differ between
        # transformers 4.20 and 5, see PADDED_POSITIONS_DIFFER)
        assert_matches(torch.stack(out.hidden_states)[:, real], tensors[f"{name}.all_hidden_states"][:, real])
        assert_matches(out.hidden_states[-1][real], tensors[f"{name}.sequence_output"][real])
        assert_matches(out.loss.reshape(1), tensors[f"{name}.loss"])
        if f"{name}.pooled_output" in tensors:
            assert_matches(model.heads[name].dense(out.hidden_states[-1][:, 0]), tensors[f"{name}.pooled_output"])
        if task["task_type"] == "Classification":
            assert torch.equal(out.logits.argmax(-1), tensors[f"{name}.predict_labels"])
            assert_matches(out.logits.softmax(-1).reshape(-1), tensors[f"{name}.predict_scores"])
        if task["task_type"] == "Regression":
            assert_matches(out.logits.reshape(-1), tensors[f"{name}.predict_scores"])
        if task["task_type"] == "Ranking":
            assert model.config.task(name)["group_size"] == task["pairwise_size"]
            assert_matches(out.group_logits, tensors[f"{name}.group_scores"])
            assert_matches(out.group_logits.softmax(-1), tensors[f"{name}.group_probs"])


def test_fixtures_cover_every_head_and_task_type(fixtures_dir):
    """Each fixture has a classification and a regression task; SAN and ranking tasks are in some of them."""
    kinds = []
    for name in FIXTURES:
        tasks = json.loads((fixtures_dir / "mtdnn" / name / "reference.json").read_text())["tasks"]
        assert {"Classification", "Regression"} <= {task["task_type"] for task in tasks}, name
        kinds += [(task["task_type"], task["enable_san"]) for task in tasks]
    assert ("Classification", True) in kinds and ("Ranking", False) in kinds


def test_san_states_match_the_original(fixture, converted):
    _, tensors, meta = fixture
    model = AutoModel.from_pretrained(converted).eval()
    for task in [task for task in meta["tasks"] if task["enable_san"]]:  # none in some fixtures
        name = task["name"]
        with torch.no_grad():
            out = model(**inputs_of(tensors, name), premise_mask=tensors[f"{name}.premise_mask"],
                        hypothesis_mask=tensors[f"{name}.hypothesis_mask"], task=name, output_san_states=True)
            derived = model(**inputs_of(tensors, name), task=name).logits  # masks from the segment ids
        states = out.san_states
        assert states.turn_logits.shape[0] == tensors[f"{name}.san_turn_scores"].shape[0]
        assert_matches(states.initial_state, tensors[f"{name}.san_h0"])
        expected = tensors[f"{name}.san_att_scores"]
        assert torch.equal(states.attention_scores.isinf(), expected.isinf())
        assert_matches(states.attention_scores[~expected.isinf()], expected[~expected.isinf()])
        assert_matches(states.premise_summaries, tensors[f"{name}.san_x_sum"])
        assert_matches(states.states, tensors[f"{name}.san_h_state"])
        assert_matches(states.rnn_outputs, tensors[f"{name}.san_gru_out"])
        assert_matches(states.turn_logits, tensors[f"{name}.san_turn_scores"])
        assert_matches(out.logits.exp(), tensors[f"{name}.san_mean_probs"])
        assert_matches(derived, tensors[f"{name}.logits"])


def test_folder_config_and_card_name_the_encoder(fixture, converted):
    folder, _, meta = fixture
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "mt-dnn" and config["encoder"]["model_type"] == meta["fixture"]
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert config["encoder"][key] == meta["encoder_config"][key]
    card = (converted / "README.md").read_text()
    display = {"roberta": "RoBERTa", "deberta": "DeBERTa", "electra": "ELECTRA"}[meta["fixture"]]
    assert f"one {display} encoder" in card and f"- {meta['fixture']}\n" in card  # the text and the tag
    assert f"use the {display} tokenizer of the encoder it was trained from" in card
    assert "bert.embeddings.position_ids" in card  # the dropped buffer is listed
    weights = load_file(str(converted / "model.safetensors"))
    assert not [key for key in weights if key.startswith("bert.pooler.") or key.endswith("position_ids")]


@pytest.mark.slow
def test_converted_folders_load_as_remote_code_without_hf_ext(fixture, converted, tmp_path):
    _, tensors, meta = fixture
    task = meta["tasks"][-1]["name"]
    torch.save(inputs_of(tensors, task), tmp_path / "batch.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.modules["hf_ext"] = None  # hf_ext must not be needed
        from transformers import AutoModel
        model = AutoModel.from_pretrained({str(converted)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        with torch.no_grad():
            logits = model(**torch.load({str(tmp_path / 'batch.pt')!r}), task={task!r}).logits
        torch.save(logits, {str(tmp_path / 'logits.pt')!r})
        """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=900)
    assert_matches(torch.load(tmp_path / "logits.pt"), tensors[f"{task}.logits"])


# ----- other configurations of these encoders, written in the original's checkpoint format ---------------------------

CONFIGURATIONS = {
    "roberta, enum encoder_type, ranking": dict(
        encoder_type=ORIGINAL.EncoderModelType.ROBERTA,
        config=("RobertaConfig", dict(vocab_size=45, hidden_size=12, num_hidden_layers=3, num_attention_heads=2,
                                      intermediate_size=20, max_position_embeddings=30, type_vocab_size=1,
                                      pad_token_id=1, bos_token_id=0, eos_token_id=2)),
        san={"num_turns": 2, "memory_type": 1, "merge_opt": 1, "rnn_type": "gru"},
        # RoBERTa's data carry segment ids 0 throughout, so no SAN task (its masks would find no hypothesis)
        tasks=[("boolq", "Classification", "PremiseAndOneHypothesis", 2, False),
               ("copa", "Ranking", "PremiseAndMultiHypothesis", 1, False),
               ("stsb", "Regression", "PremiseAndOneHypothesis", 1, False)],
        group_sizes={"copa": 2}),
    "deberta with absolute positions, SAN merge 0": dict(
        encoder_type=6,
        config=("DebertaConfig", dict(vocab_size=52, hidden_size=20, num_hidden_layers=1, num_attention_heads=5,
                                      intermediate_size=24, max_position_embeddings=36, relative_attention=True,
                                      pos_att_type="p2c|c2p", max_relative_positions=16, position_biased_input=True,
                                      type_vocab_size=0)),
        san={"num_turns": 4, "memory_type": 1, "merge_opt": 0, "rnn_type": "gru"},
        tasks=[("rte", "Classification", "PremiseAndOneHypothesis", 2, True),
               ("sst", "Classification", "PremiseOnly", 2, False)],
        group_sizes={}),
    "electra with equal embedding and hidden sizes, LSTM SAN": dict(
        encoder_type=ORIGINAL.EncoderModelType.ELECTRA,
        config=("ElectraConfig", dict(vocab_size=38, embedding_size=16, hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=18, max_position_embeddings=26)),
        san={"num_turns": 2, "memory_type": 0, "merge_opt": 1, "rnn_type": "lstm"},
        tasks=[("mrpc", "Classification", "PremiseAndOneHypothesis", 2, True),
               ("sick", "Regression", "PremiseAndOneHypothesis", 1, False)],
        group_sizes={}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_other_configurations_convert_exactly(name, tmp_path, capsys):
    spec = CONFIGURATIONS[name]
    class_name, sizes = spec["config"]
    encoder_config = getattr(transformers, class_name)(**sizes)
    tasks = [(dataset, original_task_def(t, f, n, san)) for dataset, t, f, n, san in spec["tasks"]]
    state = write_original_checkpoint(tmp_path / "model_1.pt", encoder_config, tasks, spec["san"],
                                      spec["encoder_type"])
    group_args = [arg for task, k in spec["group_sizes"].items() for arg in ("--group-size", f"{task}={k}")]
    code, _, err = run_cli(capsys, "convert", "mtdnn", tmp_path / "model_1.pt", tmp_path / "out", *group_args)
    assert code == 0, err
    model = AutoModel.from_pretrained(tmp_path / "out").eval()
    assert model.config.encoder.model_type == encoder_config.model_type
    for key in sizes:
        assert getattr(model.config.encoder, key) == getattr(encoder_config, key), key
    for index, (dataset, task_def) in enumerate(tasks):
        batch = pair_batch([(3, 2), (1, 4), (5, 1), (2, 2), (4, 3), (2, 1)], encoder_config.vocab_size, seed=index)
        if encoder_config.model_type == "roberta":  # its tokenizer returns no segment ids: the data hold zeros
            batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
        with torch.no_grad():
            out = model(**batch, task=dataset)
        expected = original_outputs(state, encoder_config, index, task_def, spec["san"], batch)
        # the original's encoder output where the head reads it: every row's first token, and the SAN's masked sums
        assert_matches(out.logits, expected)
        if dataset in spec["group_sizes"]:
            assert out.group_logits.shape == (6 // spec["group_sizes"][dataset], spec["group_sizes"][dataset])
