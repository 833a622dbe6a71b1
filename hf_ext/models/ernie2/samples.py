"""Self-made ERNIE 2.0 checkpoints in the original on-disk formats, with random weights: a Paddle static release
folder (one LoDTensor file per parameter) and a PaddleNLP folder (.pdparams pickle), for tests of configurations
other than the fixtures' and for the conversion benchmark. Nothing here needs paddle."""

import json
import pickle
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import ErnieForPreTraining

from ...export import empty_model, expected_tensors
from ...sample_text import BERT_SPECIAL_TOKENS, bundled_sentences
from .conversion import (
    BF16,
    LOD_DTYPES,
    NSP_HEAD,
    PADDLENLP_BOOKKEEPING,
    STATIC_CONFIG,
    TASK_EMBEDDING,
    UNTIED_DECODER_STATIC,
    VOCAB,
    build_config,
    parameter_table,
)

DTYPE_CODES = {np.dtype(dtype): code for code, dtype in LOD_DTYPES.items() if code != BF16}  # uint16 means uint16

# an ERNIE 2.0 base release's ernie_config.json (ERNIE_Base_en_stable-2.0.0)
BASE_CONFIG = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
               "hidden_size": 768, "initializer_range": 0.02, "max_position_embeddings": 512,
               "num_attention_heads": 12, "num_hidden_layers": 12, "sent_type_vocab_size": 4,
               "task_type_vocab_size": 16, "vocab_size": 30522}


def _varint(value):
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def lod_tensor_header(shape: Sequence[int], dtype_code: int, lod: Sequence[Sequence[int]] = ()) -> bytes:
    """The bytes before the data of a LoDTensor file as Paddle writes it (dims unpacked, one 0x10 tag each)."""
    desc = b"\x08" + _varint(dtype_code) + b"".join(b"\x10" + _varint(d) for d in shape)
    levels = b"".join(struct.pack("<Q", 8 * len(level)) + struct.pack(f"<{len(level)}Q", *level) for level in lod)
    return struct.pack("<IQ", 0, len(lod)) + levels + struct.pack("<Ii", 0, len(desc)) + desc


def write_lod_tensor(path: str | Path, array: np.ndarray, dtype_code: int | None = None,
                     lod: Sequence[Sequence[int]] = ()) -> None:
    """`array` as a Paddle LoDTensor file (`dtype_code` overrides the code, e.g. 22 for bf16 bits in uint16)."""
    array = np.ascontiguousarray(array)
    code = DTYPE_CODES[array.dtype] if dtype_code is None else dtype_code
    with open(path, "wb") as handle:
        handle.write(lod_tensor_header(array.shape, code, lod))
        array.tofile(handle)


def sample_vocab(min_size: int = 0) -> list[str]:
    """BERT special tokens, then the bundled sentences' words (and `[unusedN]` fillers up to `min_size`)."""
    words = sorted({w.strip(".,!?;:'\"").lower() for s in bundled_sentences() for w in s.split()} - {""})
    tokens = [*BERT_SPECIAL_TOKENS, *words]
    return tokens + [f"[unused{i}]" for i in range(min_size - len(tokens))]


def paddle_shapes(ernie_config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """`{static name: Paddle-layout shape}` of every weight of a checkpoint with this `ernie_config.json` dict."""
    config = build_config(ernie_config, STATIC_CONFIG, pad_token_id=0)
    shapes = expected_tensors(empty_model(ErnieForPreTraining, config))
    out = {}
    for weight in parameter_table(config.num_hidden_layers):
        shape: tuple[int, ...]
        if weight == TASK_EMBEDDING and not ernie_config.get("use_task_id"):
            shape = (config.task_type_vocab_size, config.hidden_size)  # released files may carry it unused
        else:
            shape = shapes[weight.hf]
        out[weight.static_name] = tuple(reversed(shape)) if weight.transpose else tuple(shape)
    return out


def random_weights(ernie_config: dict[str, Any], seed: int = 0, untied_decoder: bool = False,
                   task_embedding: bool = True) -> dict[str, np.ndarray]:
    """Random float32 weights in Paddle layout under the static names (scales as in the fixtures)."""
    rng = np.random.default_rng(seed)
    shapes = paddle_shapes(ernie_config)
    if untied_decoder:
        shapes[UNTIED_DECODER_STATIC.static_name] = (ernie_config["hidden_size"], ernie_config["vocab_size"])
    if not task_embedding:
        shapes.pop(TASK_EMBEDDING.static_name)
    weights = {}
    for name, shape in shapes.items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("_scale"):
            weights[name] = 1 + 0.2 * noise
        elif name.endswith("_bias"):
            weights[name] = 0.2 * noise
        elif name.endswith(".b_0"):
            weights[name] = 0.1 * noise
        elif name.endswith(".w_0"):
            weights[name] = noise / np.float32(np.sqrt(shape[0]))
        else:  # embeddings
            weights[name] = 0.3 * noise
    return weights


def write_vocab(path: str | Path, tokens: Sequence[str], tab_layout: bool = False, seed: int = 0) -> None:
    """vocab.txt: one token per line, or `token<TAB>id` lines in shuffled order (the ids, not the order, count)."""
    if tab_layout:
        order = np.random.default_rng(seed).permutation(len(tokens))
        text = "".join(f"{tokens[i]}\t{i}\n" for i in order)
    else:
        text = "".join(f"{token}\n" for token in tokens)
    Path(path).write_text(text, encoding="utf-8")


def write_static_release(folder: str | Path, ernie_config: dict[str, Any], weights: dict[str, np.ndarray],
                         tokens: Sequence[str], tab_layout: bool = False) -> Path:
    """A release folder as PaddlePaddle/ERNIE ships it: params/<name>, ernie_config.json, vocab.txt."""
    folder = Path(folder)
    (folder / "params").mkdir(parents=True, exist_ok=True)
    for name, array in weights.items():
        write_lod_tensor(folder / "params" / name, array)
    (folder / STATIC_CONFIG).write_text(json.dumps(ernie_config, indent=2, sort_keys=True))
    write_vocab(folder / VOCAB, tokens, tab_layout)
    return folder


def write_paddlenlp_folder(folder: str | Path, ernie_config: dict[str, Any], weights: dict[str, np.ndarray],
                           tokens: Sequence[str], tab_layout: bool = False,
                           nsp_head: tuple[np.ndarray, np.ndarray] | None = None) -> Path:
    """A PaddleNLP 2.8 `save_pretrained` folder: model_state.pdparams (protocol 4 pickle of numpy arrays, with the
    tied aliases and the bookkeeping key PaddleNLP adds), config.json (PaddleNLP field names), vocab.txt."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = {w.static: w.paddlenlp for w in parameter_table(ernie_config["num_hidden_layers"])}
    # the weights, and PaddleNLP's bookkeeping entry (a dict)
    state: dict[str, np.ndarray | dict[str, str]] = {names[name]: array for name, array in weights.items()
                                                     if name in names}
    untied = weights.get(UNTIED_DECODER_STATIC.static_name)
    state["cls.predictions.decoder.weight"] = state["ernie.embeddings.word_embeddings.weight"] if untied is None \
        else np.ascontiguousarray(untied.T)
    state["cls.predictions.decoder.bias"] = state["cls.predictions.decoder_bias"]
    if nsp_head is not None:  # (weight [hidden, 2], bias [2])
        state.update({NSP_HEAD[0].paddlenlp: nsp_head[0], NSP_HEAD[1].paddlenlp: nsp_head[1]})
    state[PADDLENLP_BOOKKEEPING] = {name: f"param_{i}" for i, name in enumerate(state)}
    with open(folder / "model_state.pdparams", "wb") as handle:
        pickle.dump(state, handle, protocol=4)
    c = ernie_config
    config = {"architectures": ["ErnieForMaskedLM"], "model_type": "ernie", "layer_norm_eps": 1e-12,
              "pad_token_id": 0, "pool_act": "tanh", "fuse": False, "task_id": 0,
              "intermediate_size": c.get("intermediate_size") or 4 * c["hidden_size"],
              "type_vocab_size": c.get("sent_type_vocab_size") or c.get("type_vocab_size", 2),
              **{k: v for k, v in c.items()
                 if k not in ("sent_type_vocab_size", "type_vocab_size", "intermediate_size")}}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    write_vocab(folder / VOCAB, tokens, tab_layout)
    return folder
