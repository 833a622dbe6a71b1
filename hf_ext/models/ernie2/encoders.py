"""Starting ERNIE 2.0 pre-training from a BERT-family encoder that is not ERNIE: BERT (and BERT-shaped models such as
MiniLM) and ELECTRA discriminators. ERNIE's encoder is BERT's with task embeddings added, so their weights carry over
name for name; ERNIE 2.0 then adds task embeddings (zero rows: every task starts from the encoder's own function) and
the task heads.

RoBERTa-family models are refused: their tokenizers are byte-level BPE, whose pre-tokenizer marks word starts inside
the words, which ERNIE 2.0's word-level tasks (knowledge masking, capitalization, token-document relation) read."""

from pathlib import Path
from typing import Any

from transformers import AutoModel, AutoModelForMaskedLM, ErnieConfig, ErnieForMaskedLM, PretrainedConfig

from ...errors import HfExtError

# model types whose encoder is BERT's layout (ELECTRA when its embeddings are as wide as its hidden states)
BERT_FAMILY = ("bert", "electra")
BYTE_LEVEL_FAMILY = ("roberta", "xlm-roberta", "camembert", "deberta", "deberta-v2", "modernbert")
ENCODER_SETTINGS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                    "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id")


def ernie_from_bert_family(name_or_path: str | Path, config: PretrainedConfig, **kwargs: Any) -> ErnieForMaskedLM:
    """An `ErnieForMaskedLM` holding the encoder of the BERT or ELECTRA model at `name_or_path` (`config` is its
    config), and BERT's masked-LM head where the checkpoint has one (else a fresh one, tied to the word
    embeddings), for `Ernie2ForPreTraining.from_ernie`."""
    kind = config.model_type
    if kind in BYTE_LEVEL_FAMILY:
        raise HfExtError(f"{name_or_path} is a {kind} model: its byte-level tokenizer does not split words the way "
                         "ERNIE 2.0's word-level tasks need; start from a BERT, MiniLM, ELECTRA or ERNIE model")
    if kind not in BERT_FAMILY:
        raise HfExtError(f"{name_or_path} holds a {kind} model, not ERNIE or a BERT-family encoder "
                         f"({', '.join(BERT_FAMILY)})")
    if getattr(config, "embedding_size", config.hidden_size) != config.hidden_size:
        raise HfExtError(f"{name_or_path}: its embeddings ({config.embedding_size}) are narrower than its hidden "
                         f"states ({config.hidden_size}), which ERNIE's encoder cannot hold")
    ernie = ErnieForMaskedLM(ErnieConfig(**{name: getattr(config, name) for name in ENCODER_SETTINGS}))
    if kind == "bert":  # BertForMaskedLM: the encoder under `bert.`, the MLM head as ERNIE's
        source = AutoModelForMaskedLM.from_pretrained(name_or_path, **kwargs).state_dict()
        state = {f"ernie.{name.removeprefix('bert.')}" if name.startswith("bert.") else name: tensor
                 for name, tensor in source.items()}
    else:  # an ELECTRA discriminator: the encoder alone
        state = {f"ernie.{name}": tensor for name, tensor in AutoModel.from_pretrained(name_or_path, **kwargs)
                 .state_dict().items()}
    _, unexpected = ernie.load_state_dict(state, strict=False)
    if unexpected:
        raise HfExtError(f"{name_or_path}: weights with no place in ERNIE's encoder: {', '.join(unexpected[:4])}")
    return ernie


__all__ = ["BERT_FAMILY", "ernie_from_bert_family"]
