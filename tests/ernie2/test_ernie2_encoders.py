"""ERNIE 2.0 pre-training started from BERT-family encoders other than ERNIE (tiny configs of BERT with its MLM
head, a MiniLM-shaped BERT encoder without one, as all-MiniLM-L6-v2 ships, and an ELECTRA discriminator): their
weights carry over (ERNIE's encoder computes what theirs did) and `hf-ext ernie2 pretrain` trains from them."""

import json

import pytest
import torch
from conftest import cli_exit_code
from streaming_corpus import tokenizer, write_corpus
from transformers import BertConfig, BertForMaskedLM, BertModel, ElectraConfig, ElectraModel

from hf_ext.models.ernie2.training import load_pretraining_model

pytestmark = pytest.mark.slow

SIZES = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)


def bert(vocab_size):
    return BertForMaskedLM(BertConfig(vocab_size=vocab_size, num_hidden_layers=2, **SIZES))


def minilm(vocab_size):  # all-MiniLM-L6-v2's shape at a tiny width: six layers, a BertModel without MLM head
    return BertModel(BertConfig(vocab_size=vocab_size, num_hidden_layers=6, **SIZES))


def electra(vocab_size):
    return ElectraModel(ElectraConfig(vocab_size=vocab_size, embedding_size=32, num_hidden_layers=2, **SIZES))


@pytest.mark.parametrize("make", [bert, minilm, electra])
def test_a_bert_family_encoder_starts_a_pretraining_run(make, tmp_path, capsys):
    tok = tokenizer()
    torch.manual_seed(0)
    source = make(len(tok)).eval()
    folder = tmp_path / "encoder"
    source.save_pretrained(folder)
    tok.save_pretrained(folder)
    model = load_pretraining_model(folder).eval()
    ids = torch.tensor([[2, 5, 6, 7, 20, 3, 0]])
    mask = (ids != 0).long()
    encoder = getattr(source, "bert", source)
    with torch.no_grad():
        expected = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = model.ernie(input_ids=ids, attention_mask=mask, task_type_ids=torch.full_like(ids, 3)).last_hidden_state
    # zero task-embedding rows: ERNIE's encoder computes what the source's did, for every task id
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)

    corpus = write_corpus(tmp_path / "corpus", shards=2)
    stages = tmp_path / "stages.yml"
    stages.write_text("stages:\n  - steps: {knowledge_masking: 2, capitalization: 1}\n")
    code = cli_exit_code(["--quiet", "ernie2", "pretrain", folder, "--documents", corpus, "--streaming", "--stages",
                          stages, "--output-dir", tmp_path / "run", "--batch-size", "2", "--max-length", "32",
                          "--logging-steps", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["step"] == 3 and (tmp_path / "run" / "ernie" / "model.safetensors").is_file()
