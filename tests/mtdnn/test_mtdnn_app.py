"""`hf-ext serve` on an MT-DNN folder, through Gradio's API on a local port: `predict` answers every task head's
prediction as the model computes it, pair tasks only for a pair."""

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

pytestmark = pytest.mark.slow
APP_FOLDER = "mtdnn_sample_folder"  # the `client` fixture serves it
PREMISE, HYPOTHESIS = "a man is playing .", "a woman is sleeping ."


def test_predict_gives_every_head_s_prediction(client, mtdnn_sample_folder):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert list(endpoints) == ["/predict"]
    predictions = client.predict(PREMISE, HYPOTHESIS, api_name="/predict")
    assert list(predictions) == ["sst", "nli", "sts"]
    model, tokenizer = AutoModel.from_pretrained(mtdnn_sample_folder).eval(), AutoTokenizer.from_pretrained(
        mtdnn_sample_folder)
    with torch.no_grad():
        sst = model(**tokenizer(PREMISE, return_tensors="pt"), task="sst").logits.softmax(-1)[0]
        pair = tokenizer(PREMISE, HYPOTHESIS, return_tensors="pt")
        nli = model(**pair, task="nli").logits.exp()[0]  # the SAN head gives log-probabilities
        sts = model(**pair, task="sts").logits.item()
    sst_probabilities = dict(zip(["negative", "positive"], sst.tolist(), strict=True))
    assert predictions["sst"]["probabilities"] == pytest.approx(sst_probabilities)
    nli_probabilities = dict(zip(["contradiction", "neutral", "entailment"], nli.tolist(), strict=True))
    assert predictions["nli"]["probabilities"] == pytest.approx(nli_probabilities)
    assert predictions["nli"]["label"] == max(nli_probabilities, key=nli_probabilities.get)
    assert predictions["sts"] == {"type": "regression", "score": pytest.approx(sts)}


def test_one_sentence_feeds_the_single_sentence_tasks_only(client):
    predictions = client.predict(PREMISE, "", api_name="/predict")
    assert predictions["nli"] == {"type": "classification", "needs": "a sentence pair"}
    assert predictions["sts"] == {"type": "regression", "needs": "a sentence pair"}
    assert predictions["sst"] == client.predict(PREMISE, HYPOTHESIS, api_name="/predict")["sst"]


def test_the_views_show_probabilities_scores_and_what_is_missing():
    from hf_ext.models.mtdnn.app import MTDNNApp

    views = MTDNNApp.views({"a": {"type": "classification", "probabilities": {"x": 0.25, "y": 0.75}},
                            "b": {"type": "regression", "score": 1.5},
                            "c": {"type": "ranking", "needs": "a sentence pair"}}, ["a", "b", "c"])
    assert views == [{"x": 0.25, "y": 0.75}, "regression score 1.5000", "needs a sentence pair"]


def test_an_empty_sentence_is_one_message(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="^the sentence is empty$"):
        client.predict(" ", HYPOTHESIS, api_name="/predict")
