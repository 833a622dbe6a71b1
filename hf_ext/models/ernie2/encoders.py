"""Starting ERNIE 2.0 pre-training from a BERT-family encoder that is not ERNIE: BERT (and BERT-shaped models such as
MiniLM), ELECTRA discriminators, and RoBERTa with its sentencepiece kin (XLM-RoBERTa, CamemBERT). ERNIE's encoder
is BERT's with task embeddings added, so their weights carry over; ERNIE 2.0 then adds task embeddings (zero rows:
every task starts from the encoder's own function) and the task heads.

RoBERTa's encoder is BERT's too, with three differences the start absorbs:
- positions: RoBERTa numbers the real tokens from `pad_token_id + 1` (its first `pad_token_id + 1` rows of position
  embeddings serve padding only), ERNIE from 0: ERNIE gets the rows from `pad_token_id + 1` on, and
  `max_position_embeddings` shrinks by as many (514 -> 512 for roberta-base). Real tokens of right-padded batches,
  which is how ERNIE 2.0's collator pads, then see the same position embeddings;
- one token type (`type_vocab_size` 1) and its own layer-norm epsilon (1e-5): copied with the other settings;
- its MLM head (`lm_head`: dense, GELU, layer norm, decoder) is BERT's under other names.

The word-level tasks need word boundaries, which every fast tokenizer reports (`data.Ernie2DataBuilder.encode`), so
the tokenizer family does not matter. DeBERTa and ModernBERT are refused: their attention (disentangled relative
positions; rotary positions, local attention) is not BERT's, so no ERNIE encoder computes what they do."""

from pathlib import Path
from typing import Any

from transformers import AutoModel, AutoModelForMaskedLM, ErnieConfig, ErnieForMaskedLM, PretrainedConfig

from ...errors import HfExtError

# model types whose encoder is BERT's layout (ELECTRA when its embeddings are as wide as its hidden states)
BERT_FAMILY = ("bert", "electra")
# BERT's layout under `roberta.`, with positions that start after the padding id
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")
OTHER_ATTENTION = ("deberta", "deberta-v2", "modernbert")
ENCODER_SETTINGS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                    "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id")
# RobertaLMHead's names -> BertLMPredictionHead's (ERNIE's `cls.predictions`)
ROBERTA_HEAD = {"lm_head.dense.": "cls.predictions.transform.dense.",
                "lm_head.layer_norm.": "cls.predictions.transform.LayerNorm.",
                "lm_head.decoder.": "cls.predictions.decoder.", "lm_head.bias": "cls.predictions.bias"}
POSITIONS = "ernie.embeddings.position_embeddings.weight"


def ernie_from_bert_family(name_or_path: str | Path, config: PretrainedConfig, **kwargs: Any) -> ErnieForMaskedLM:
    """An `ErnieForMaskedLM` holding the encoder of the BERT, ELECTRA or RoBERTa-family model at `name_or_path`
    (`config` is its config), and its masked-LM head where the checkpoint has one (else a fresh one, tied to the
    word embeddings), for `Ernie2ForPreTraining.from_ernie`."""
    kind = config.model_type
    if kind in OTHER_ATTENTION:
        raise HfExtError(f"{name_or_path} is a {kind} model: its attention is not BERT's (relative or rotary "
                         "positions), which ERNIE's encoder cannot compute; start from a BERT, MiniLM, ELECTRA, "
                         "RoBERTa, XLM-RoBERTa, CamemBERT or ERNIE model")
    if kind not in BERT_FAMILY + ROBERTA_FAMILY:
        raise HfExtError(f"{name_or_path} holds a {kind} model, not ERNIE or a BERT-family encoder "
                         f"({', '.join(BERT_FAMILY + ROBERTA_FAMILY)})")
    if getattr(config, "embedding_size", config.hidden_size) != config.hidden_size:
        raise HfExtError(f"{name_or_path}: its embeddings ({config.embedding_size}) are narrower than its hidden "
                         f"states ({config.hidden_size}), which ERNIE's encoder cannot hold")
    settings = {name: getattr(config, name) for name in ENCODER_SETTINGS}
    if kind in ROBERTA_FAMILY:
        first_position = config.pad_token_id + 1
        settings["max_position_embeddings"] -= first_position
        if settings["max_position_embeddings"] < 1:
            raise HfExtError(f"{name_or_path}: its {config.max_position_embeddings} positions leave none after the "
                             f"{first_position} that RoBERTa keeps for padding")
    ernie = ErnieForMaskedLM(ErnieConfig(**settings))
    if kind == "electra":  # a discriminator: the encoder alone
        state = {f"ernie.{name}": tensor for name, tensor in AutoModel.from_pretrained(name_or_path, **kwargs)
                 .state_dict().items()}
    else:  # *ForMaskedLM: the encoder under `bert.` or `roberta.`, the MLM head as ERNIE's
        source = AutoModelForMaskedLM.from_pretrained(name_or_path, **kwargs).state_dict()
        prefix = "bert." if kind == "bert" else "roberta."
        state = {_ernie_name(name, prefix): tensor for name, tensor in source.items()}
    if kind in ROBERTA_FAMILY:
        state[POSITIONS] = state[POSITIONS][first_position:]
    _, unexpected = ernie.load_state_dict(state, strict=False)
    if unexpected:
        raise HfExtError(f"{name_or_path}: weights with no place in ERNIE's encoder: {', '.join(unexpected[:4])}")
    return ernie


def _ernie_name(name: str, prefix: str) -> str:
    if name.startswith(prefix):
        return f"ernie.{name.removeprefix(prefix)}"
    head = next((source for source in ROBERTA_HEAD if name.startswith(source)), None)
    return ROBERTA_HEAD[head] + name.removeprefix(head) if head else name


__all__ = ["BERT_FAMILY", "ROBERTA_FAMILY", "ernie_from_bert_family"]
