"""MT-DNN's custom pipelines (`pipeline_mtdnn.MTDNNPipeline`, task "mt-dnn", and `feature-extraction`): from a folder
hf-ext wrote, with hf-ext imported and in an interpreter without it (`trust_remote_code=True`), every head's
prediction as the model computes it, and the shared encoder's hidden states as features."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertTokenizer, pipeline

from hf_ext.export import write_model_folder
from hf_ext.models.mtdnn import ENTRY, MTDNNModel
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml

TASKS = """\
sst: {data_format: PremiseOnly, enable_san: false, labels: [negative, positive], n_class: 2, task_type: Classification}
nli: {data_format: PremiseAndOneHypothesis, enable_san: true, labels: [contradiction, neutral, entailment],
      n_class: 3, task_type: Classification}
sts: {data_format: PremiseAndOneHypothesis, enable_san: false, n_class: 1, task_type: Regression}
qnli: {data_format: PremiseAndMultiHypothesis, enable_san: false, n_class: 1, task_type: Ranking}
tags: {data_format: Seqence, labels: [O, B-PER, I-PER, B-LOC, I-LOC], n_class: 5, task_type: SeqenceLabeling}
squad: {data_format: CLUE_SPAN, n_class: 2, task_type: SpanClassification}
"""
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "mary", "went", "to", "paris", "where", "did", "go",
         "?", ".", "##s", "is", "playing", "sleeping"]
QUESTION, CONTEXT = "where did john go ?", "john went to paris ."


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtdnn_pipeline")
    encoder = BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, max_position_embeddings=40)
    torch.manual_seed(0)
    model = MTDNNModel(config_from_task_def_yaml(TASKS, encoder))
    tokenizer = BertTokenizer(vocab={token: index for index, token in enumerate(WORDS)})
    write_model_folder(root, MTDNNModel, model.config, model.state_dict(), ENTRY.auto_map, processor=tokenizer)
    return root


def expected_predictions(folder, text, text_pair=None):
    """Every head's prediction computed with the model's own forward, one task at a time."""
    model, tokenizer = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    single, pair = tokenizer(text, return_tensors="pt"), text_pair and tokenizer(text, text_pair, return_tensors="pt")
    with torch.no_grad():
        sst = model(**single, task="sst").logits[0].softmax(-1).tolist()
        words = text.split()
        encoded = tokenizer(words, is_split_into_words=True, return_tensors="pt")
        tag_ids = model(**encoded, task="tags").logits[0].argmax(-1).tolist()
        first_piece = {word: position for position, word in reversed(list(enumerate(encoded.word_ids(0))))
                       if word is not None}
        labels = model.config.task("tags")["labels"]
        expected = {"sst": {"type": "classification", "label": ["negative", "positive"][sst.index(max(sst))],
                            "probabilities": dict(zip(["negative", "positive"], sst, strict=True))},
                    "tags": [[word, labels[tag_ids[first_piece[index]]]] for index, word in enumerate(words)]}
        if pair:
            nli = model(**pair, task="nli").logits[0].exp().tolist()  # a SAN head gives log-probabilities
            expected["nli"] = dict(zip(["contradiction", "neutral", "entailment"], nli, strict=True))
            expected["sts"] = model(**pair, task="sts").logits.item()
            expected["qnli"] = model(**pair, task="qnli", group_size=1).logits.item()
            qa = tokenizer(text, text_pair, return_offsets_mapping=True, return_tensors="pt")
            offsets = qa.pop("offset_mapping")[0].tolist()
            output = model(**qa, task="squad")
            context_tokens = [i for i, sequence in enumerate(qa.sequence_ids(0)) if sequence == 1]
            spans = [(output.start_logits[0, s] + output.end_logits[0, e], s, e) for s in context_tokens
                     for e in context_tokens if s <= e]
            _, start, end = max(spans)
            expected["squad"] = text_pair[offsets[start][0]:offsets[end][1]]
    return expected


def rounded(value):
    """`value` with its floats rounded (padding in a batch moves them in the last digits)."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item) for item in value]
    return value


def check(predictions, expected):
    assert predictions["sst"]["label"] == expected["sst"]["label"]
    assert predictions["sst"]["probabilities"] == pytest.approx(expected["sst"]["probabilities"], abs=1e-5)
    assert predictions["tags"]["tags"] == expected["tags"]
    if "nli" in expected:
        assert predictions["nli"]["probabilities"] == pytest.approx(expected["nli"], abs=1e-5)
        assert predictions["sts"] == {"type": "regression", "score": pytest.approx(expected["sts"], abs=1e-5)}
        assert predictions["qnli"] == {"type": "ranking", "score": pytest.approx(expected["qnli"], abs=1e-5)}
        assert predictions["squad"] == {"type": "span_classification", "answer": expected["squad"]}


def test_the_folder_declares_the_pipeline_and_carries_its_code(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["custom_pipelines"] == {
        "mt-dnn": {"impl": "pipeline_mtdnn.MTDNNPipeline", "pt": ["AutoModel"], "type": "text"},
        "feature-extraction": {"impl": "pipeline_mtdnn.MTDNNFeatureExtractionPipeline", "pt": ["AutoModel"],
                               "type": "text"}}
    assert (folder / "pipeline_mtdnn.py").is_file()


def test_every_head_s_prediction_is_the_model_s(folder):
    predict = pipeline("mt-dnn", model=str(folder), trust_remote_code=True)
    assert type(predict).__name__ == "MTDNNPipeline"
    predictions = predict({"text": QUESTION, "text_pair": CONTEXT})
    assert list(predictions) == ["sst", "nli", "sts", "qnli", "tags", "squad"]
    check(predictions, expected_predictions(folder, QUESTION, CONTEXT))
    entities = predictions["tags"]["entities"]
    assert all(set(entity) == {"type", "text", "first_word", "last_word"} for entity in entities)


def test_one_text_feeds_single_text_tasks_and_says_what_pair_tasks_need(folder):
    predictions = pipeline("mt-dnn", model=str(folder), trust_remote_code=True)("mary is playing .")
    check(predictions, expected_predictions(folder, "mary is playing ."))
    for name, kind in (("nli", "classification"), ("sts", "regression"), ("qnli", "ranking")):
        assert predictions[name] == {"type": kind, "needs": "a sentence pair"}
    assert predictions["squad"] == {"type": "span_classification",
                                    "needs": "a question and a context (the text pair)"}


def test_one_task_and_a_list_of_inputs_batched(folder):
    predict = pipeline("mt-dnn", model=str(folder), trust_remote_code=True)
    inputs = ["mary is playing .", {"text": QUESTION, "text_pair": CONTEXT}, "john went to paris ."]
    one_by_one = [predict(text) for text in inputs]
    check(one_by_one[1], expected_predictions(folder, QUESTION, CONTEXT))
    for batch_size in (1, 2):
        batched = predict(inputs, batch_size=batch_size)
        assert len(batched) == 3
        for got, alone in zip(batched, one_by_one, strict=True):
            assert rounded(got) == rounded(alone)
    assert predict(inputs[1], task="nli") == {"nli": one_by_one[1]["nli"]}


def test_an_unknown_task_or_input_is_one_line(folder):
    predict = pipeline("mt-dnn", model=str(folder), trust_remote_code=True)
    with pytest.raises(ValueError, match=r"^unknown task 'mnli'; the model's tasks are sst, nli, sts, qnli, tags, "
                                         r"squad$"):
        predict("john went to paris .", task="mnli")
    with pytest.raises(ValueError, match=r"^an MT-DNN pipeline input is a text or a dict of text and text_pair "
                                         r"\(texts\), not dict \['premise'\]$"):
        predict({"premise": "john"})


def test_text_classification_reads_the_default_task(folder):
    classify = pipeline("text-classification", model=str(folder), top_k=None)
    scores = {row["label"]: row["score"] for row in classify(["mary is playing ."])[0]}
    assert scores == pytest.approx(expected_predictions(folder, "mary is playing .")["sst"]["probabilities"],
                                   abs=1e-5)


def test_feature_extraction_gives_the_encoder_s_hidden_states_not_a_head_s_logits(folder):
    model = AutoModel.from_pretrained(folder, default_task="sst").eval()  # a default task: logits come first
    tokenizer = AutoTokenizer.from_pretrained(folder)
    extract = pipeline("feature-extraction", model=str(folder), trust_remote_code=True)
    assert type(extract).__name__ == "MTDNNFeatureExtractionPipeline"
    for text in (QUESTION, "mary is playing ."):
        with torch.no_grad():
            expected = model.encode(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        features = torch.tensor(extract(text)[0])
        assert features.shape == expected.shape == (len(tokenizer(text)["input_ids"]), 16)
        torch.testing.assert_close(features, expected, atol=1e-5, rtol=0)
    # a loaded model gets it by name, as any custom pipeline class
    from hf_ext.models.mtdnn import MTDNNFeatureExtractionPipeline

    extract = pipeline("feature-extraction", model=model, tokenizer=tokenizer,
                       pipeline_class=MTDNNFeatureExtractionPipeline)
    torch.testing.assert_close(torch.tensor(extract("mary is playing .")[0]), features, atol=1e-5, rtol=0)
    # without the folder's code, transformers says so instead of returning a head's logits
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("feature-extraction", model=str(folder))


@pytest.mark.slow
def test_the_pipeline_runs_where_hf_ext_is_not_installed(folder, tmp_path):
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["hf_ext"] = None  # hf_ext must not be needed
        from transformers import pipeline
        predict = pipeline("mt-dnn", model={str(folder)!r}, trust_remote_code=True)
        inputs = [{{"text": {QUESTION!r}, "text_pair": {CONTEXT!r}}}, "mary is playing ."]
        print(json.dumps(predict(inputs, batch_size=2)))
        """)
    result = subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, capture_output=True, text=True,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    check(remote[0], expected_predictions(folder, QUESTION, CONTEXT))
    check(remote[1], expected_predictions(folder, "mary is playing ."))


def test_training_outputs_and_saved_models_carry_the_pipeline(folder, tmp_path):
    """`save_training_run` writes `custom_pipelines` with the code; `save_pretrained` of a model loaded from a folder
    that had them keeps the entry and copies the code."""
    from types import SimpleNamespace

    from hf_ext.trainer import save_training_run

    model = AutoModel.from_pretrained(folder)
    model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "pipeline_mtdnn.py").is_file()
    assert "mt-dnn" in json.loads((tmp_path / "saved" / "config.json").read_text())["custom_pipelines"]
    fresh = MTDNNModel(model.config.__class__.from_dict({**model.config.to_dict(), "custom_pipelines": {}}))
    save_training_run(tmp_path / "run", SimpleNamespace(model=fresh, state=SimpleNamespace(log_history=[])))
    assert (tmp_path / "run" / "pipeline_mtdnn.py").is_file()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["custom_pipelines"] == \
        json.loads((folder / "config.json").read_text())["custom_pipelines"]
