"""Processor pairing Optimus' two tokenizers: the encoder's (BERT WordPiece in the original) and the decoder's
(GPT-2 BPE in the original)."""

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from transformers import BatchEncoding, PreTrainedTokenizerBase, ProcessorMixin

DECODER_SPECIAL_TOKENS = {"pad_token": "<PAD>", "bos_token": "<BOS>", "eos_token": "<EOS>"}


def check_decoder_special_tokens(decoder_tokenizer: PreTrainedTokenizerBase) -> None:
    """`ValueError` with one line unless the decoder tokenizer has pad, BOS and EOS tokens, three different ones: the
    loss skips pads (an EOS that were the pad would never be learnt) and decoding stops at the first EOS (a BOS that
    were the EOS would end every text before it starts)."""
    missing = [name for name in ("pad_token", "bos_token", "eos_token") if getattr(decoder_tokenizer, name) is None]
    if missing:
        raise ValueError(f"the decoder tokenizer has no {', '.join(missing)}: use add_decoder_special_tokens()")
    ids = {name: getattr(decoder_tokenizer, f"{name}_id") for name in ("pad_token", "bos_token", "eos_token")}
    if len(set(ids.values())) < 3:
        raise ValueError(f"the decoder tokenizer's pad, BOS and EOS tokens must differ, got ids {ids['pad_token']}, "
                         f"{ids['bos_token']}, {ids['eos_token']}: use add_decoder_special_tokens()")


class OptimusProcessor(ProcessorMixin):
    r"""
    Builds both sides of an Optimus batch from raw text and decodes generated ids.

    Args:
        tokenizer: the encoder's tokenizer (saved at the folder root, so `AutoTokenizer` finds it).
        decoder_tokenizer: the decoder's tokenizer, with a pad, a BOS and an EOS token, three different ones (the
            original adds `<PAD>`, `<BOS>`, `<EOS>` in that order to GPT-2's; saved in `decoder_tokenizer/`).
    """

    decoder_tokenizer: PreTrainedTokenizerBase  # set by ProcessorMixin.__init__, as `tokenizer` is

    def __init__(self, tokenizer=None, decoder_tokenizer=None, **kwargs):
        if decoder_tokenizer is not None:
            check_decoder_special_tokens(decoder_tokenizer)
        super().__init__(tokenizer, decoder_tokenizer, **kwargs)

    @staticmethod
    def add_decoder_special_tokens(decoder_tokenizer: PreTrainedTokenizerBase) -> int:
        """Add `<PAD>`, `<BOS>`, `<EOS>` as the original does (ids V, V+1, V+2); returns how many were new."""
        return decoder_tokenizer.add_special_tokens(dict(DECODER_SPECIAL_TOKENS))

    def __call__(self, text=None, decoder_text=None, max_length=None, return_tensors="pt", **kwargs):
        """Encoder inputs (`input_ids`, `attention_mask`) for `text` and decoder `labels` for `decoder_text`
        (default: `text` itself, the auto-encoding setting): `<BOS> ... <EOS>`, right-padded with `<PAD>`."""
        if text is None and decoder_text is None:
            raise ValueError("give text (encoder side), decoder_text (decoder side) or both")
        batch = {}
        if text is not None:
            encoded = self.tokenizer(text, padding=True, truncation=max_length is not None, max_length=max_length,
                                     return_tensors=return_tensors, return_token_type_ids=False)
            batch.update(encoded)
            decoder_text = text if decoder_text is None else decoder_text
        batch["labels"] = self.decoder_labels(decoder_text, max_length=max_length, return_tensors=return_tensors)
        return BatchEncoding(batch)

    def decoder_labels(self, text: str | Iterable[str], max_length: int | None = None,
                       return_tensors: str | None = "pt") -> torch.Tensor | list[list[int]]:
        """`<BOS> tokens <EOS>` per text, right-padded with `<PAD>` (truncated to `max_length` with EOS kept)."""
        texts = [text] if isinstance(text, str) else list(text)
        tok = self.decoder_tokenizer
        rows = []
        for ids in tok(texts, add_special_tokens=False)["input_ids"]:
            if max_length is not None:
                ids = ids[: max(max_length - 2, 0)]
            rows.append([tok.bos_token_id, *ids, tok.eos_token_id])
        width = max(len(row) for row in rows)
        padded = [row + [tok.pad_token_id] * (width - len(row)) for row in rows]
        return torch.tensor(padded, dtype=torch.long) if return_tensors == "pt" else padded

    def batch_decode(self, sequences: Iterable[torch.Tensor | Sequence[int]], **kwargs: Any) -> list[str]:
        """Decoder ids -> text, cut at the first `<EOS>`, special tokens removed."""
        tok = self.decoder_tokenizer
        texts = []
        for row in sequences:
            row = row.tolist() if hasattr(row, "tolist") else list(row)
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id)]
            # one sequence of ids decodes to one str (transformers' decode has no overloads saying so)
            texts.append(tok.decode(row, skip_special_tokens=True, **kwargs).strip())  # type: ignore[union-attr]
        return texts

    def decode(self, sequence: torch.Tensor | Sequence[int], **kwargs: Any) -> str:
        return self.batch_decode([sequence], **kwargs)[0]

    @property
    def model_input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "labels"]


__all__ = ["OptimusProcessor", "check_decoder_special_tokens"]
