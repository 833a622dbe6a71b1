"""Tiny stand-ins of pretrained backbones for `hf-ext optimus init`: folders as a Hub download leaves them (a
config, random weights, a tokenizer) for encoders and causal language models of any type, with tokenizers trained
on the bundled sentences and the special tokens a real model family has. The tests build from them, and the
real-backbone reproduction's `--quick` run stands them in for the real models."""

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, BertTokenizer, GPT2Tokenizer

from ...sample_text import bundled_sentences, train_bert_vocab, train_gpt2_bpe

ENCODER_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=64)
# the sizes under each type's own names where they differ from BERT's
ENCODER_TYPE_SIZES = {
    "modernbert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       global_attn_every_n_layers=1, local_attention=16, max_position_embeddings=64),
    "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
}
DECODER_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
DECODER_TYPE_SIZES = {
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "mamba": dict(hidden_size=32, num_hidden_layers=2, state_size=4, expand=2, conv_kernel=4),
}
# the special tokens of real model families: GPT-2's one <|endoftext|> for BOS and EOS and no pad; Llama/SmolLM2's
# own BOS and EOS with the EOS as pad; Qwen2's EOS as pad and no BOS
SPECIAL_TOKENS: dict[str, dict[str, str | None]] = {
    "gpt2": dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token=None),
    "llama": dict(bos_token="<s>", eos_token="</s>", pad_token="</s>"),
    "qwen2": dict(bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>"),
}


def write_encoder(folder: Path, model_type: str = "bert", seed: int = 0, **config: Any) -> Path:
    """A BERT-vocabulary tokenizer (pad id 0) and a random `model_type` encoder of a size that fits it."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = BertTokenizer(vocab=str(train_bert_vocab(bundled_sentences(), tmp)))
    sizes = ENCODER_TYPE_SIZES.get(model_type, ENCODER_SIZES)
    # ModernBERT's config names its [CLS] and [SEP] ids (BOS and EOS too), by default those of its own vocabulary
    special = {name: getattr(tokenizer, f"{token}_id") for name, token in (
        ("cls_token_id", "cls_token"), ("sep_token_id", "sep_token"), ("bos_token_id", "cls_token"),
        ("eos_token_id", "sep_token"))} if model_type == "modernbert" else {}
    encoder_config = AutoConfig.for_model(model_type, **{**sizes, "vocab_size": len(tokenizer),
                                                         "pad_token_id": tokenizer.pad_token_id, **special, **config})
    torch.manual_seed(seed)
    AutoModel.from_config(encoder_config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_decoder(folder: Path, model_type: str = "gpt2", seed: int = 0, tokens: str | None = None,
                  **config: Any) -> Path:
    """A byte-level BPE tokenizer with the special tokens of the family `tokens` (`SPECIAL_TOKENS`; `model_type`'s
    own by default) and a random `model_type` causal language model whose vocabulary is the tokenizer's."""
    with tempfile.TemporaryDirectory() as tmp:
        train_gpt2_bpe(bundled_sentences(), tmp, vocab_size=300)
        special = SPECIAL_TOKENS[tokens or (model_type if model_type in SPECIAL_TOKENS else "llama")]
        # no unknown token, as byte-level BPE needs none (GPT2Tokenizer's annotation asks for one)
        tokenizer = GPT2Tokenizer(vocab=str(Path(tmp) / "vocab.json"), merges=str(Path(tmp) / "merges.txt"),
                                  unk_token=None, **special)  # type: ignore[arg-type]
    ids = {name.replace("_token", "_token_id"): getattr(tokenizer, f"{name}_id") for name in special}
    sizes = DECODER_TYPE_SIZES.get(model_type, DECODER_SIZES)
    decoder_config = AutoConfig.for_model(model_type, **{**sizes, "vocab_size": len(tokenizer), **ids, **config})
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(decoder_config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_sentence_transformers_pooling(folder: Path, mode: str = "mean") -> Path:
    """sentence-transformers' files beside a transformers folder: `modules.json` and the pooling settings of `mode`
    (`mean`, `cls` or `max`), as all-MiniLM-L6-v2 has them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    width = json.loads((folder / "config.json").read_text())["hidden_size"]
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": width, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": mode == "max",
        "pooling_mode_mean_sqrt_len_tokens": False}))
    return folder
