"""The halting map of a Universal Transformer with ACT: the ponder time N + R of every position of an input (and of a
seq2seq model's greedy output), as values and as a figure (matplotlib, optional)."""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ...errors import HfExtError
from ...plots import new_figure
from .configuration_universal_transformer import UniversalTransformerConfig
from .modeling_universal_transformer import UniversalTransformerForSeq2SeqLM

if TYPE_CHECKING:  # matplotlib is imported only when a figure is drawn
    from matplotlib.figure import Figure


@dataclass
class HaltingRow:
    """Ponder time (steps N plus remainder R) of each position of one side, labelled with its tokens."""

    side: str
    tokens: list
    ponder_time: list


# a map is one column per position: past a few hundred it is unreadable, and ACT over thousands of positions (and a
# greedy output as long) takes minutes
MAX_HALTING_MAP_TOKENS = 512


@torch.no_grad()
def halting_map(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str,
                max_new_tokens: int | None = None) -> list[HaltingRow]:
    """The per-position ponder time N + R of `text` under a Universal Transformer with ACT: the encoder's over the
    input tokens and, for a seq2seq model, the decoder's over its greedy output (each decoder position labelled with
    the token it predicts). Returns a list of `HaltingRow`."""
    config = model.config
    if getattr(config, "model_type", None) != UniversalTransformerConfig.model_type:
        raise HfExtError(f"a halting map needs a Universal Transformer, got a {config.model_type!r} model")
    if not config.use_act:
        raise HfExtError("the model has ACT switched off (use_act=False): every position takes the same steps")
    try:
        input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    except Exception as error:  # noqa: BLE001 - tokenizers raise plain Exceptions for unknown characters
        raise HfExtError(f"cannot tokenize {text!r}: {str(error).splitlines()[0]}") from None
    if input_ids.shape[1] == 0:
        raise HfExtError("the input is empty")
    for what, length in (("the input", input_ids.shape[1]), ("the output (max_new_tokens)", max_new_tokens or 0)):
        if length > MAX_HALTING_MAP_TOKENS:
            raise HfExtError(f"{what} has {length} tokens; a halting map takes at most {MAX_HALTING_MAP_TOKENS}")
    was_training = model.training
    model.eval()
    try:
        input_ids = input_ids.to(next(model.parameters()).device)
        # a list of ids converts to a list of tokens (transformers' convert_ids_to_tokens has no overloads saying so)
        tokens: list[str] = tokenizer.convert_ids_to_tokens(input_ids[0].tolist())  # type: ignore[assignment]
        if not isinstance(model, UniversalTransformerForSeq2SeqLM):
            encoder = model(input_ids=input_ids)
            return [HaltingRow("encoder", tokens, _ponder_time(encoder.n_updates, encoder.remainders))]
        generated = model.generate(input_ids=input_ids, max_new_tokens=max_new_tokens or input_ids.shape[1] + 1,
                                   do_sample=False, num_beams=1)
        outputs = model(input_ids=input_ids, decoder_input_ids=generated[:, :-1])
        return [HaltingRow("encoder", tokens, _ponder_time(outputs.encoder_n_updates, outputs.encoder_remainders)),
                HaltingRow("decoder", tokenizer.convert_ids_to_tokens(generated[0, 1:].tolist()),  # type: ignore[arg-type]
                           _ponder_time(outputs.decoder_n_updates, outputs.decoder_remainders))]
    finally:
        model.train(was_training)


def _ponder_time(n_updates, remainders):
    return (n_updates + remainders)[0].float().tolist()


def plot_halting_map(rows: Iterable[HaltingRow], path: str | Path, title: str | None = None, max_annotated: int = 48,
                     ) -> Path:
    """PNG (or any matplotlib format, from `path`'s suffix) of `halting_map_figure`."""
    halting_map_figure(rows, title, max_annotated).savefig(Path(path), dpi=100)
    return Path(path)


def halting_map_figure(rows: Iterable[HaltingRow], title: str | None = None, max_annotated: int = 48) -> "Figure":
    """A figure of `halting_map` rows: one heatmap strip per side with a position per column, coloured by ponder
    time N + R on one shared scale, tokens under the columns and the values written in the cells when a side has at
    most `max_annotated` positions."""
    rows = [row for row in rows if row.ponder_time]
    if not rows:
        raise HfExtError("no positions to plot")
    longest = max(len(row.ponder_time) for row in rows)
    low = min(min(row.ponder_time) for row in rows)
    high = max(max(row.ponder_time) for row in rows)
    figure = new_figure(min(max(4.0, 0.35 * longest + 2.0), 40.0), 1.3 * len(rows) + 0.8)
    axes = figure.subplots(len(rows), 1, squeeze=False)[:, 0]
    image = None
    for axis, row in zip(axes, rows, strict=True):
        values = np.asarray(row.ponder_time, dtype=np.float64)[None]
        image = axis.imshow(values, aspect="auto", cmap="viridis", vmin=low, vmax=max(high, low + 1e-6))
        axis.set_yticks([0], [row.side])
        step = max(1, len(row.tokens) // 60)  # long inputs: label every step-th position
        axis.set_xticks(range(0, len(row.tokens), step), row.tokens[::step], fontsize=8)
        if len(row.ponder_time) <= max_annotated:
            middle = (low + high) / 2
            for position, value in enumerate(row.ponder_time):
                axis.text(position, 0, f"{value:.1f}", ha="center", va="center", fontsize=7,
                          color="black" if value > middle else "white")
    assert image is not None  # drawn for each of the rows, which are not empty
    figure.colorbar(image, ax=list(axes), label="ponder time N + R", shrink=0.9)
    figure.suptitle(title or "Halting map (steps per position)")
    return figure


__all__ = ["HaltingRow", "MAX_HALTING_MAP_TOKENS", "halting_map", "halting_map_figure", "plot_halting_map"]
