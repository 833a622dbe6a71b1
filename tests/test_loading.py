"""`hf_ext.loading`: a tokenizer that does not load is one line, and for a folder that holds none, the line says how
to give it one instead of transformers' paragraph about the Hub."""

import pytest
from transformers import BertConfig

from hf_ext.errors import HfExtError
from hf_ext.loading import load_tokenizer


@pytest.fixture
def model_folder(tmp_path):
    BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    return tmp_path


def test_a_folder_without_a_tokenizer_is_told_how_to_add_one(model_folder, no_network):
    with pytest.raises(HfExtError) as raised:
        load_tokenizer(str(model_folder))
    assert str(raised.value) == (
        f"{model_folder} has no tokenizer: save one into the folder (AutoTokenizer.from_pretrained(NAME)"
        f".save_pretrained({str(model_folder)!r})), or convert the original again with --tokenizer NAME where its "
        "converter offers it")


def test_a_broken_tokenizer_is_one_line_of_its_own(model_folder, no_network):
    (model_folder / "tokenizer_config.json").write_text("{")
    with pytest.raises(HfExtError, match=f"^{model_folder} has no usable tokenizer: ") as raised:
        load_tokenizer(str(model_folder))
    assert "\n" not in str(raised.value)
