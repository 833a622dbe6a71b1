"""MT-DNN fixtures for every test (registered by `tests/conftest.py`): a tiny multi-task model folder for the app, the
shared `hf-ext serve` tests and the bad-input commands."""

import pytest

MTDNN_APP_TASKS = """\
sst:
  data_format: PremiseOnly
  enable_san: false
  labels: [negative, positive]
  n_class: 2
  task_type: Classification
nli:
  data_format: PremiseAndOneHypothesis
  enable_san: true
  labels: [contradiction, neutral, entailment]
  n_class: 3
  task_type: Classification
sts:
  data_format: PremiseAndOneHypothesis
  enable_san: false
  n_class: 1
  task_type: Regression
"""
MTDNN_APP_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "woman", "is", "playing", "sleeping",
                   "."]


@pytest.fixture(scope="session")
def mtdnn_sample_folder(tmp_path_factory):
    """A tiny MT-DNN model (a single-sentence task, a SAN pair task, a regression pair task) with a BERT
    tokenizer."""
    import torch
    from transformers import BertConfig, BertTokenizer

    from hf_ext.models.mtdnn import MTDNNModel
    from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml

    root = tmp_path_factory.mktemp("mtdnn_app")
    encoder = BertConfig(vocab_size=len(MTDNN_APP_WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, max_position_embeddings=40)
    torch.manual_seed(0)
    MTDNNModel(config_from_task_def_yaml(MTDNN_APP_TASKS, encoder)).save_pretrained(root / "model")
    (root / "vocab.txt").write_text("\n".join(MTDNN_APP_WORDS) + "\n", encoding="utf-8")
    BertTokenizer(vocab_file=str(root / "vocab.txt")).save_pretrained(root / "model")
    return root / "model"
