"""`hf-ext serve` on a Universal Transformer folder, through Gradio's API on a local port: `halting_map` answers the
library's halting map and the greedy output, and bad input gets one clear message."""

import pytest

from hf_ext.models.universal_transformer.halting_map import halting_map
from hf_ext.models.universal_transformer.loading import load_model_and_tokenizer

pytestmark = pytest.mark.slow
APP_FOLDER = "algorithmic_seq2seq_folder"  # the `client` fixture serves it


def test_halting_map_is_the_library_s(client, algorithmic_seq2seq_folder):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert list(endpoints) == ["/halting_map"]
    output, rows = client.predict("31415", 0, api_name="/halting_map")
    model, tokenizer = load_model_and_tokenizer(str(algorithmic_seq2seq_folder))
    expected = halting_map(model, tokenizer, "31415")
    assert [(row["side"], row["tokens"]) for row in rows] == [(row.side, row.tokens) for row in expected]
    for row, reference in zip(rows, expected, strict=True):
        assert row["ponder_time"] == pytest.approx(reference.ponder_time, abs=1e-6)
    assert len(set(rows[0]["ponder_time"])) > 1  # positions halt after different numbers of steps
    assert output == "".join(token for token in expected[1].tokens if token not in ("</s>", "<pad>"))
    _, longer = client.predict("31415", 9, api_name="/halting_map")
    assert len(longer[1]["tokens"]) == 9  # a random model rarely ends early: it writes all 9


def test_the_views_are_a_heatmap_and_a_table_per_position():
    from hf_ext.models.universal_transformer.app import UniversalTransformerApp

    rows = [{"side": "encoder", "tokens": ["1", "</s>"], "ponder_time": [2.5, 4.0]},
            {"side": "decoder", "tokens": ["1"], "ponder_time": [3.0]}]
    figure, table = UniversalTransformerApp.views(rows, "1")
    assert table == [["encoder", 0, "1", 2.5], ["encoder", 1, "</s>", 4.0], ["decoder", 0, "1", 3.0]]
    assert [axis.get_yticklabels()[0].get_text() for axis in figure.axes[:2]] == ["encoder", "decoder"]


@pytest.mark.parametrize("text, message", [
    ("", "^the input is empty$"),
    ("12a4", "^cannot tokenize '12a4': "),
])
def test_bad_input_is_one_message(client, text, message):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=message):
        client.predict(text, 0, api_name="/halting_map")
