"""Universal Transformer fixtures for every test (registered by `tests/conftest.py`): a tiny seq2seq model folder for
the app and the bad-input commands."""

import pytest


@pytest.fixture(scope="session")
def algorithmic_seq2seq_folder(tmp_path_factory):
    """A tiny seq2seq Universal Transformer with ACT over the algorithmic vocabulary, with its tokenizer; the
    halting unit starts at bias 0, so that positions halt after different numbers of steps."""
    import torch

    from hf_ext.models.universal_transformer import UniversalTransformerForSeq2SeqLM
    from hf_ext.models.universal_transformer.training import algorithmic_config, algorithmic_tokenizer

    folder = tmp_path_factory.mktemp("universal_transformer_app") / "model"
    torch.manual_seed(0)
    config = algorithmic_config(hidden_size=16, num_attention_heads=2, intermediate_size=32, act_max_steps=4,
                                dropout=0.0, act_halting_bias_init=0.0)
    UniversalTransformerForSeq2SeqLM(config).save_pretrained(folder)
    algorithmic_tokenizer().save_pretrained(folder)
    return folder
