"""Conversion of ERNIE 2.0 checkpoints (PaddlePaddle/ERNIE, PaddleNLP) into a transformers `ernie` folder, without
paddle.

Sources:
- a Paddle static-graph release folder: `params/` with one LoDTensor file per parameter (names of `model/ernie.py`),
  `ernie_config.json`, `vocab.txt`;
- a PaddleNLP folder: `model_state.pdparams` (or one other `*.pdparams`), `config.json` (or the older
  `model_config.json` with `init_args`), `vocab.txt`.

The output is an `ErnieForPreTraining` folder (encoder, pooler, MLM head) with a BERT tokenizer; it needs no remote
code. The checkpoints carry no next-sentence head, so `cls.seq_relationship` is written as zeros (50/50).
"""

import argparse
import hashlib
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import BertTokenizer, ErnieConfig, ErnieForPreTraining
from transformers.utils import logging

from ...arguments import positive_float
from ...checkpoints import load_numpy_pickle
from ...conversion import (
    Compared,
    ParityCheck,
    Tolerance,
    add_output_arguments,
    compare_with_reference,
    load_reference,
    print_parity,
    require_parity,
)
from ...errors import HfExtError, one_line
from ...export import empty_model, expected_tensors, file_record, sha256, write_model_folder
from ...text_files import read_json
from . import ENTRY
from .configuration_ernie2 import validate_ernie_encoder

logger = logging.get_logger(__name__)

STATIC_CONFIG = "ernie_config.json"
PADDLENLP_WEIGHTS = "model_state.pdparams"
PADDLENLP_CONFIGS = ("config.json", "model_config.json")
VOCAB = "vocab.txt"
# Paddle's layer_norm default, which the original graph uses (PaddleNLP's re-implementation forces 1e-12)
ORIGINAL_LAYER_NORM_EPS = 1e-5
REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "max_position_embeddings")
# activations of the original (fluid layer names) whose transformers namesake computes the same function
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid"}
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PADDLENLP_BOOKKEEPING = "StructuredToParameterName@@"

# LoDTensor `VarType.Type` codes -> numpy storage dtype (bf16 is stored as its raw 16 bits)
LOD_DTYPES = {0: np.bool_, 1: np.int16, 2: np.int32, 3: np.int64, 4: np.float16, 5: np.float32, 6: np.float64,
              20: np.uint8, 21: np.int8, 22: np.uint16}
BF16 = 22
MAX_DESC_BYTES = 1 << 16


@dataclass(frozen=True)
class Weight:
    """One parameter under its three names; `transpose` for Paddle fc weights ([in, out]) -> nn.Linear ([out, in])."""

    static: str | None
    paddlenlp: str
    hf: str
    transpose: bool = False

    @property
    def static_name(self) -> str:
        """The name in a static checkpoint's `params/`; refuses the weights only PaddleNLP checkpoints hold."""
        if self.static is None:
            raise ValueError(f"{self.paddlenlp} has no name in static checkpoints")
        return self.static


def _linear(static, paddlenlp, hf):
    return [Weight(f"{static}.w_0", f"{paddlenlp}.weight", f"{hf}.weight", True),
            Weight(f"{static}.b_0", f"{paddlenlp}.bias", f"{hf}.bias")]


def _layer_norm(static, paddlenlp, hf):
    return [Weight(f"{static}_scale", f"{paddlenlp}.weight", f"{hf}.weight"),
            Weight(f"{static}_bias", f"{paddlenlp}.bias", f"{hf}.bias")]


TASK_EMBEDDING = Weight("task_embedding", "ernie.embeddings.task_type_embeddings.weight",
                        "ernie.embeddings.task_type_embeddings.weight")


def parameter_table(num_layers: int) -> list[Weight]:
    """Every weight of an ERNIE 2.0 checkpoint with an MLM head (names of model/ernie.py, PaddleNLP, transformers)."""
    emb = "ernie.embeddings"
    table = [Weight("word_embedding", f"{emb}.word_embeddings.weight", f"{emb}.word_embeddings.weight"),
             Weight("pos_embedding", f"{emb}.position_embeddings.weight", f"{emb}.position_embeddings.weight"),
             Weight("sent_embedding", f"{emb}.token_type_embeddings.weight", f"{emb}.token_type_embeddings.weight"),
             TASK_EMBEDDING,
             *_layer_norm("pre_encoder_layer_norm", f"{emb}.layer_norm", f"{emb}.LayerNorm")]
    for i in range(num_layers):
        static, paddlenlp, hf = f"encoder_layer_{i}_", f"ernie.encoder.layers.{i}.", f"ernie.encoder.layer.{i}."
        for s, p, h in (("multi_head_att_query_fc", "self_attn.q_proj", "attention.self.query"),
                        ("multi_head_att_key_fc", "self_attn.k_proj", "attention.self.key"),
                        ("multi_head_att_value_fc", "self_attn.v_proj", "attention.self.value"),
                        ("multi_head_att_output_fc", "self_attn.out_proj", "attention.output.dense"),
                        ("ffn_fc_0", "linear1", "intermediate.dense"),
                        ("ffn_fc_1", "linear2", "output.dense")):
            table += _linear(static + s, paddlenlp + p, hf + h)
        table += _layer_norm(f"{static}post_att_layer_norm", f"{paddlenlp}norm1", f"{hf}attention.output.LayerNorm")
        table += _layer_norm(f"{static}post_ffn_layer_norm", f"{paddlenlp}norm2", f"{hf}output.LayerNorm")
    table += _linear("pooled_fc", "ernie.pooler.dense", "ernie.pooler.dense")
    table += _linear("mask_lm_trans_fc", "cls.predictions.transform", "cls.predictions.transform.dense")
    table += _layer_norm("mask_lm_trans_layer_norm", "cls.predictions.layer_norm",
                         "cls.predictions.transform.LayerNorm")
    table.append(Weight("mask_lm_out_fc.b_0", "cls.predictions.decoder_bias", "cls.predictions.bias"))
    return table


# optional weights: an MLM decoder of its own (weight_sharing=False), PaddleNLP's next-sentence head
UNTIED_DECODER_STATIC = Weight("mask_lm_out_fc.w_0", "", "cls.predictions.decoder.weight", True)
UNTIED_DECODER_PADDLENLP = "cls.predictions.decoder.weight"  # PaddleNLP also stores the tied one under this name
NSP_HEAD = [Weight(None, "cls.seq_relationship.weight", "cls.seq_relationship.weight", True),
            Weight(None, "cls.seq_relationship.bias", "cls.seq_relationship.bias")]


# ---------------------------------------------------------------------------------------------- LoDTensor files

def _varint(data, pos, what):
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise HfExtError(f"{what}: corrupt tensor description (bad varint)")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def parse_tensor_desc(data: bytes, what: str) -> tuple[int, list[int]]:
    """`VarType.TensorDesc` protobuf -> (data type code, dims): field 1 varint, field 2 repeated int64 (unpacked or
    packed); other fields are skipped by wire type."""
    dtype, dims, pos = None, [], 0
    while pos < len(data):
        key, pos = _varint(data, pos, what)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos, what)
            if number == 1:
                dtype = value
            elif number == 2:
                dims.append(value - (1 << 64) if value >= 1 << 63 else value)
        elif wire == 2:
            length, pos = _varint(data, pos, what)
            if pos + length > len(data):
                raise HfExtError(f"{what}: corrupt tensor description (field {number} runs past its end)")
            if number == 2:
                inner = 0
                while inner < length:
                    value, inner = _varint(data[pos:pos + length], inner, what)
                    dims.append(value - (1 << 64) if value >= 1 << 63 else value)
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise HfExtError(f"{what}: corrupt tensor description (wire type {wire})")
    if dtype is None:
        raise HfExtError(f"{what}: the tensor description has no data type")
    if any(d < 0 for d in dims):
        raise HfExtError(f"{what}: the tensor description has negative dims {dims}")
    return dtype, dims


def _read_exact(handle, size, what):
    data = handle.read(size)
    if len(data) != size:
        raise HfExtError(f"{what} is truncated (the header ends after {handle.tell()} bytes)")
    return data


def read_lod_tensor_header(handle: BinaryIO, what: str) -> tuple[type[np.generic], int, list[int]]:
    """Read the header of a LoDTensor file up to its raw data; returns (numpy storage dtype, dtype code, dims)."""
    (version,) = struct.unpack("<I", _read_exact(handle, 4, what))
    if version != 0:
        raise HfExtError(f"{what} is not a Paddle LoDTensor file (version {version}, expected 0)")
    (lod_level,) = struct.unpack("<Q", _read_exact(handle, 8, what))
    if lod_level > 16:
        raise HfExtError(f"{what} is not a Paddle LoDTensor file ({lod_level} LoD levels)")
    size = os.fstat(handle.fileno()).st_size
    for _ in range(lod_level):
        (nbytes,) = struct.unpack("<Q", _read_exact(handle, 8, what))
        if nbytes > size - handle.tell():  # checked before reading: a corrupt header may announce exabytes
            raise HfExtError(f"{what} is truncated or corrupt (a LoD block of {nbytes} bytes, {size - handle.tell()} "
                             "left in the file)")
        handle.seek(nbytes, os.SEEK_CUR)  # sequence offsets: weights carry none worth keeping
    (tensor_version,) = struct.unpack("<I", _read_exact(handle, 4, what))
    if tensor_version != 0:
        raise HfExtError(f"{what} is not a Paddle LoDTensor file (tensor version {tensor_version}, expected 0)")
    (desc_len,) = struct.unpack("<i", _read_exact(handle, 4, what))
    if not 0 < desc_len <= MAX_DESC_BYTES:
        raise HfExtError(f"{what} is not a Paddle LoDTensor file (tensor description of {desc_len} bytes)")
    code, dims = parse_tensor_desc(_read_exact(handle, desc_len, what), what)
    if code not in LOD_DTYPES:
        raise HfExtError(f"{what} has unknown data type code {code} (known: "
                         f"{', '.join(str(c) for c in sorted(LOD_DTYPES))})")
    return LOD_DTYPES[code], code, dims


def read_lod_tensor(path: str | Path, expected_shape: Sequence[int] | None = None, what: str | None = None,
                    ) -> torch.Tensor:
    """One LoDTensor file as a torch tensor over a copy-on-write map of its data (pages are read when touched, once).
    `expected_shape` is checked against the header, and the file size against it, before any data is read."""
    what = what or str(path)
    with open(path, "rb") as handle:
        dtype, code, dims = read_lod_tensor_header(handle, what)
        offset, size = handle.tell(), os.fstat(handle.fileno()).st_size
    if expected_shape is not None and tuple(dims) != tuple(expected_shape):
        raise ShapeMismatch(dims, expected_shape)
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * np.dtype(dtype).itemsize
    if size - offset < nbytes:
        raise HfExtError(f"{what} is truncated ({size - offset} of the {nbytes} data bytes its header announces)")
    if size - offset > nbytes:
        raise HfExtError(f"{what} has {size - offset - nbytes} bytes after the {nbytes} data bytes its header "
                         "announces")
    array = np.memmap(path, dtype=dtype, mode="c", offset=offset, shape=tuple(dims)) if count \
        else np.empty(dims, dtype)
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if code == BF16 else tensor


class ShapeMismatch(Exception):
    """Raised by `read_lod_tensor` so that the caller can name the config the dims disagree with."""

    def __init__(self, dims, expected):
        super().__init__(dims, expected)
        self.dims, self.expected = list(dims), list(expected)


# ------------------------------------------------------------------------------------------------------ sources

@dataclass
class ErnieSource:
    """Where the original files are and what format they have (`static` or `paddlenlp`)."""

    folder: Path
    format: str
    config_path: Path
    vocab_path: Path
    weights_path: Path  # params/ or the .pdparams file

    def describe(self) -> str:
        return "Paddle static-graph release" if self.format == "static" else "PaddleNLP"


def looks_original(path: Path) -> bool:
    """Whether `path` is laid out as a PaddlePaddle checkpoint, by its file names (what `find_source` reads): a
    static release (params/ and ernie_config.json), a PaddleNLP folder (a .pdparams file) or its .pdparams file."""
    if path.is_file():
        return path.suffix == ".pdparams"
    return path.is_dir() and (((path / "params").is_dir() and (path / STATIC_CONFIG).is_file())
                              or any(path.glob("*.pdparams")))


def find_source(src: str | Path, vocab: str | Path | None = None) -> ErnieSource:
    """Resolve SRC (a release folder, a PaddleNLP folder or its .pdparams file) to the files to read."""
    src = Path(src)
    if not src.exists():
        raise HfExtError(f"source {src} does not exist")
    if src.is_file():
        if src.suffix != ".pdparams":
            raise HfExtError(f"source {src} is a file but not a .pdparams; give the checkpoint folder")
        folder, weights = src.parent, src
    else:
        folder, weights = src, None
    if weights is None and (folder / "params").is_dir():
        config = folder / STATIC_CONFIG
        if not config.exists():  # a FIFO or device is refused when read, not taken for no config
            raise HfExtError(f"source {folder} has params/ but no {STATIC_CONFIG}")
        return ErnieSource(folder, "static", config, _vocab_path(folder, vocab), folder / "params")
    if weights is None:
        candidates = [folder / PADDLENLP_WEIGHTS] if (folder / PADDLENLP_WEIGHTS).is_file() \
            else sorted(folder.glob("*.pdparams"))
        if len(candidates) > 1:
            raise HfExtError(f"source {folder} holds several .pdparams files ({', '.join(p.name for p in candidates)});"
                             " give the one to convert")
        if not candidates:
            raise HfExtError(f"source {folder} is neither a Paddle static release (params/ + {STATIC_CONFIG}) nor a "
                             f"PaddleNLP folder ({PADDLENLP_WEIGHTS} + config.json)")
        weights = candidates[0]
    configs = [folder / name for name in PADDLENLP_CONFIGS if (folder / name).exists()]
    if not configs:
        raise HfExtError(f"source {folder} has {weights.name} but no {' or '.join(PADDLENLP_CONFIGS)}")
    return ErnieSource(folder, "paddlenlp", configs[0], _vocab_path(folder, vocab), weights)


def _vocab_path(folder, vocab):
    path = Path(vocab) if vocab is not None else folder / VOCAB
    if not path.is_file():
        raise HfExtError(f"vocabulary {path} does not exist" + ("" if vocab else " (give --vocab)"))
    return path


# ------------------------------------------------------------------------------------------------------- config

def read_source_config(source: ErnieSource) -> dict[str, Any]:
    """The source config as a flat dict of the original's field names (PaddleNLP's `init_args` unwrapped)."""
    config = read_json(source.config_path, "config")
    if not isinstance(config, dict):
        raise HfExtError(f"config {source.config_path} is not a JSON object")
    if "init_args" in config:  # PaddleNLP < 2.5: {"init_args": [{...ErnieModel args...}], "init_class": ...}
        config = _init_args(config) or config
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if (model_type not in (None, "ernie")
            or any(not str(name).lower().startswith("ernie") for name in architectures)):
        kind = model_type or ", ".join(map(str, architectures))
        raise HfExtError(f"config {source.config_path} describes a {kind} model, not ERNIE")
    missing = [key for key in REQUIRED_CONFIG_KEYS if key not in config]
    if missing:
        raise HfExtError(f"config {source.config_path} is not an ERNIE config: it lacks {', '.join(missing)}")
    for key in REQUIRED_CONFIG_KEYS:
        if isinstance(config[key], bool) or not isinstance(config[key], int):
            raise HfExtError(f"config {source.config_path}: {key} must be an integer, got {config[key]!r}")
    return config


def _init_args(config):
    for arg in config.get("init_args") or []:
        if isinstance(arg, dict):
            if "hidden_size" in arg:
                return arg
            if found := _init_args(arg):
                return found
    return None


def build_config(source_config: dict[str, Any], config_path: str | Path, pad_token_id: int,
                 layer_norm_eps: float = ORIGINAL_LAYER_NORM_EPS) -> ErnieConfig:
    """`ErnieConfig` from the original's config fields (see `docs/ernie2.md` for each rule)."""
    c = source_config
    act = c.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise HfExtError(f"config {config_path}: hidden_act {act!r} is not one of {', '.join(ACTIVATIONS)}")
    pool_act = c.get("pool_act", "tanh")
    if pool_act != "tanh":
        raise HfExtError(f"config {config_path}: pool_act {pool_act!r} (transformers' pooler is tanh)")
    # model/ernie.py: a truthy sent_type_vocab_size wins over type_vocab_size
    type_vocab = c.get("sent_type_vocab_size") or c.get("type_vocab_size") or 2
    try:
        config = ErnieConfig(
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            num_hidden_layers=c["num_hidden_layers"],
            num_attention_heads=c["num_attention_heads"],
            intermediate_size=c.get("intermediate_size") or 4 * c["hidden_size"],  # the 2019 graph: 4 * hidden
            hidden_act=ACTIVATIONS[act],
            hidden_dropout_prob=c.get("hidden_dropout_prob", 0.1),
            attention_probs_dropout_prob=c.get("attention_probs_dropout_prob", 0.1),
            max_position_embeddings=c["max_position_embeddings"],
            type_vocab_size=type_vocab,
            use_task_id=bool(c.get("use_task_id", False)),
            task_type_vocab_size=c.get("task_type_vocab_size") or 3,
            initializer_range=c.get("initializer_range", 0.02),
            layer_norm_eps=layer_norm_eps,
            pad_token_id=pad_token_id,
        )
        validate_ernie_encoder(config)
    except (ValueError, StrictDataclassError) as error:
        raise HfExtError(f"config {config_path}: {one_line(error)}") from None
    return config


# ------------------------------------------------------------------------------------------------------ weights

@dataclass
class ErnieWeights:
    """transformers-named tensors plus what the conversion noticed."""

    state: dict
    tie_word_embeddings: bool = True
    notes: list = field(default_factory=list)


def _source_shape(weight, hf_shape):
    return tuple(reversed(hf_shape)) if weight.transpose else tuple(hf_shape)


def _to_hf(weight, tensor):
    return tensor.T.contiguous() if weight.transpose else tensor


def _check_complete(where, missing):
    if missing:
        raise HfExtError(f"{where} lacks {len(missing)} weight(s) an ERNIE checkpoint with this config has: "
                         f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")


def _floating(tensor, name):
    if not tensor.is_floating_point():
        raise HfExtError(f"{name} holds {str(tensor.dtype).removeprefix('torch.')} values, not floating-point weights")
    return tensor


def _dims_error(source, name, dims, expected):
    return HfExtError(f"{name} has dims {list(dims)}, but {source.config_path.name} implies {list(expected)}")


def _plan(config):
    """The weights a checkpoint with `config` must have, and `{transformers name: shape}`."""
    shapes = expected_tensors(empty_model(ErnieForPreTraining, config))
    table = [w for w in parameter_table(config.num_hidden_layers)
             if w != TASK_EMBEDDING or config.use_task_id]
    return table, shapes


def read_static_weights(source: ErnieSource, config: ErnieConfig) -> ErnieWeights:
    """Read `params/<name>` LoDTensor files; dims are checked against `config` from each header before the data."""
    table, shapes = _plan(config)
    params = source.weights_path
    present = {p.name for p in params.iterdir() if p.is_file()}
    missing = [w.static for w in table if w.static not in present]
    _check_complete(params, missing)
    weights = ErnieWeights({})
    untied = UNTIED_DECODER_STATIC.static in present
    if untied:
        table.append(UNTIED_DECODER_STATIC)
        shapes[UNTIED_DECODER_STATIC.hf] = (config.vocab_size, config.hidden_size)
    for weight in table:
        try:
            tensor = read_lod_tensor(params / weight.static, _source_shape(weight, shapes[weight.hf]),
                                     what=f"params/{weight.static}")
        except ShapeMismatch as error:
            raise _dims_error(source, f"params/{weight.static}", error.dims, error.expected) from None
        weights.state[weight.hf] = _to_hf(weight, _floating(tensor, f"params/{weight.static}"))
    _set_decoder(weights, untied)
    _note_skipped(weights, sorted(present - {w.static for w in table}), "params/", TASK_EMBEDDING.static)
    return weights


def read_paddlenlp_weights(source: ErnieSource, config: ErnieConfig) -> ErnieWeights:
    """Read a .pdparams pickle (numpy arrays only) and rename its keys."""
    state = load_numpy_pickle(source.weights_path, "PaddleNLP weights")
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise HfExtError(f"PaddleNLP weights {source.weights_path} are not a dict of named arrays")
    state = {k: v for k, v in state.items() if k != PADDLENLP_BOOKKEEPING}
    if not any(k.startswith("ernie.") for k in state):  # saved from a bare ErnieModel
        state = {(k if k.startswith("cls.") else f"ernie.{k}"): v for k, v in state.items()}
    table, shapes = _plan(config)
    missing = [w.paddlenlp for w in table if w.paddlenlp not in state]
    _check_complete(f"PaddleNLP weights {source.weights_path}", missing)
    weights = ErnieWeights({})
    decoder = state.get(UNTIED_DECODER_PADDLENLP)
    untied = decoder is not None and not np.array_equal(decoder, state[table[0].paddlenlp])  # else the tied alias
    if untied:  # [vocab, hidden] like the embedding it replaces, or a Linear's [hidden, vocab]
        assert decoder is not None  # an untied decoder is there
        vocab_first = decoder.shape == (config.vocab_size, config.hidden_size)
        table.append(Weight(None, UNTIED_DECODER_PADDLENLP, UNTIED_DECODER_PADDLENLP, not vocab_first))
        shapes[UNTIED_DECODER_PADDLENLP] = (config.vocab_size, config.hidden_size)
    if all(w.paddlenlp in state for w in NSP_HEAD):
        table += NSP_HEAD
    for weight in table:
        array = state[weight.paddlenlp]
        if not isinstance(array, np.ndarray):
            raise HfExtError(f"PaddleNLP weights {source.weights_path}: {weight.paddlenlp} is not an array")
        expected = _source_shape(weight, shapes[weight.hf])
        if array.shape != expected:
            raise _dims_error(source, weight.paddlenlp, array.shape, expected)
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if array.dtype == np.uint16:  # paddle hands bf16 tensors to numpy as their raw bits
            tensor = tensor.view(torch.bfloat16)
        weights.state[weight.hf] = _to_hf(weight, _floating(tensor, weight.paddlenlp))
    _set_decoder(weights, untied)
    used = {w.paddlenlp for w in table} | {UNTIED_DECODER_PADDLENLP, "cls.predictions.decoder.bias"}
    _note_skipped(weights, sorted(set(state) - used), "", TASK_EMBEDDING.paddlenlp)
    return weights


def _set_decoder(weights, untied):
    """An untied decoder (weight_sharing=False) also needs its own copy of the output bias."""
    weights.tie_word_embeddings = not untied
    if untied:
        weights.state["cls.predictions.decoder.bias"] = weights.state["cls.predictions.bias"].clone()
        weights.notes.append("the MLM decoder is not tied to the word embedding (weight_sharing=False)")


def _note_skipped(weights, names, prefix, task_embedding):
    if task_embedding in names:
        names.remove(task_embedding)
        weights.notes.append(f"{prefix}{task_embedding} is present but the config does not set use_task_id, so the "
                             "original code never used it: it was left out")
    if names:
        shown = ", ".join(prefix + n for n in names[:6]) + (" ..." if len(names) > 6 else "")
        weights.notes.append(f"ignored {len(names)} tensor(s) that are not part of the pre-trained encoder and MLM "
                             f"head (task heads, optimizer state): {shown}")


def add_missing_nsp_head(weights: ErnieWeights, config: ErnieConfig) -> None:
    """ERNIE 2.0 checkpoints have no next-sentence head: write a zero one (it predicts 50/50), and say so."""
    if NSP_HEAD[0].hf in weights.state:
        return
    dtype = weights.state["ernie.pooler.dense.weight"].dtype
    weights.state[NSP_HEAD[0].hf] = torch.zeros(2, config.hidden_size, dtype=dtype)
    weights.state[NSP_HEAD[1].hf] = torch.zeros(2, dtype=dtype)
    weights.notes.append("the checkpoint has no next-sentence head: cls.seq_relationship is zero (it predicts 50/50); "
                         "train it before using seq_relationship_logits")


# ---------------------------------------------------------------------------------------------------- tokenizer

TAB_LINE = re.compile(r"^(.*)\t(\d+)$")


def read_vocab(path: str | Path) -> dict[str, int]:
    """`{token: id}` from a vocab.txt with one token per line (id = line number) or `token<TAB>id` lines."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise HfExtError(f"vocabulary {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise HfExtError(f"vocabulary {path} is empty")
    vocab: dict[str, int] = {}
    tab_layout = "\t" in lines[0]
    for number, line in enumerate(lines, 1):
        if tab_layout:
            match = TAB_LINE.match(line)
            if not match:
                raise HfExtError(f"vocabulary {path} line {number} is not `token<TAB>id` like line 1: {line!r}")
            token, index = match.group(1), int(match.group(2))
        else:
            token, index = line, number - 1
        vocab.setdefault(token, index)  # a repeated token keeps its first id, as in the original reader
    if tab_layout and len(set(vocab.values())) != len(vocab):
        raise HfExtError(f"vocabulary {path} gives the same id to two tokens")
    missing = [token for token in BERT_SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise HfExtError(f"vocabulary {path} lacks {', '.join(missing)}: not an ERNIE/BERT vocabulary")
    return vocab


def build_tokenizer(vocab: dict[str, int], config: ErnieConfig, do_lower_case: bool = True) -> BertTokenizer:
    """A BERT WordPiece tokenizer over `vocab`, checked to fit the embedding matrix."""
    top = max(vocab.values())
    if top >= config.vocab_size:
        raise HfExtError(f"the vocabulary has id {top}, but the checkpoint's word embedding has only "
                         f"{config.vocab_size} rows")
    return BertTokenizer(vocab=vocab, do_lower_case=do_lower_case, model_max_length=config.max_position_embeddings)


def _lower_case(source, do_lower_case):
    if do_lower_case is not None:
        return do_lower_case
    tokenizer_config = source.folder / "tokenizer_config.json"
    if tokenizer_config.is_file():  # PaddleNLP writes one beside the vocab
        return bool(read_json(tokenizer_config, "tokenizer config").get("do_lower_case", True))
    return True  # every released ERNIE vocabulary is uncased


# ------------------------------------------------------------------------------------------------- conversion

def source_files(source: ErnieSource, checksums: bool) -> list[dict]:
    """Rows for the provenance table: config and vocab always hashed, weights hashed when `checksums`."""
    rows = [file_record(p) for p in (source.config_path, source.vocab_path)]
    not_computed = "not computed (--checksums)"
    if source.format == "static":
        files = sorted(p for p in source.weights_path.iterdir() if p.is_file())
        if checksums:
            manifest = "".join(f"{sha256(p)}  {p.name}\n" for p in files)
            digest = f"{hashlib.sha256(manifest.encode()).hexdigest()} (of the sha256sum manifest)"
        else:
            digest = not_computed
        rows.append({"name": f"params/ ({len(files)} files)", "bytes": sum(p.stat().st_size for p in files),
                     "sha256": digest})
    else:
        path = source.weights_path
        rows.append(file_record(path) if checksums else
                    {"name": path.name, "bytes": path.stat().st_size, "sha256": not_computed})
    return rows


# the original's outputs a `--reference` file may hold, each with its tolerance (the fixture's reference.json:
# atol 1e-4, rtol 1e-4)
REFERENCE_TOLERANCES = {name: Tolerance(atol=1e-4, rtol=1e-4) for name in (
    "sequence_output_key_mask", "mlm_logits_key_mask", "pooled_output", "sequence_output", "mlm_logits")}


def reference_outputs(model: ErnieForPreTraining, reference: dict[str, torch.Tensor]) -> dict[str, Compared]:
    """The converted model's outputs beside the original's (the fixtures' `reference.safetensors` layout): key-mask
    tensors at every position, original-mask tensors at real tokens."""
    model.eval()
    inputs: dict[str, torch.Tensor] = {
        "input_ids": reference["input_ids"], "attention_mask": reference["attention_mask"],
        **{k: reference[k] for k in ("token_type_ids", "position_ids", "task_type_ids") if k in reference}}
    if not model.config.use_task_id:
        inputs.pop("task_type_ids", None)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    sequence, logits = out.hidden_states[-1], out.prediction_logits
    pooler = model.ernie.pooler
    assert pooler is not None  # ErnieForPreTraining builds its encoder with the pooler
    pooled = pooler(sequence)
    real = reference["attention_mask"].bool()
    ours = {"sequence_output_key_mask": sequence, "mlm_logits_key_mask": logits, "pooled_output": pooled,
            "sequence_output": sequence[real], "mlm_logits": logits[real]}
    # the original masks padded query rows too: its own-mask outputs compare at real tokens only
    shown = {"sequence_output": "sequence_output (real tokens)", "mlm_logits": "mlm_logits (real tokens)"}
    return {shown.get(key, key): Compared(value, reference[key][real] if key in shown else reference[key],
                                          REFERENCE_TOLERANCES[key])
            for key, value in ours.items() if key in reference}


def convert_ernie2_checkpoint(src: str | Path, out: str | Path, *, vocab: str | Path | None = None,
                              do_lower_case: bool | None = None, layer_norm_eps: float = ORIGINAL_LAYER_NORM_EPS,
                              reference: str | Path | None = None, checksums: bool = False, overwrite: bool = False,
                              push_to_hub: str | None = None, private: bool = False,
                              token: str | None = None) -> list[ParityCheck]:
    """Convert an ERNIE 2.0 Paddle checkpoint into a transformers `ernie` folder at `out` (written atomically), with
    a model card; optionally push it. Returns the parity checks (none without `reference`); a check beyond its
    tolerance fails the conversion (`HfExtError`, nothing written)."""
    from ... import __version__
    from ...hub import card_data, push_folder, write_model_card
    from ...output import atomic_output_dir, check_output_dir

    check_output_dir(out, overwrite)
    reference_tensors = load_reference(reference) if reference is not None else None
    source = find_source(src, vocab)
    logger.info(f"reading the {source.describe()} checkpoint in {source.folder}")
    tokens = read_vocab(source.vocab_path)
    config = build_config(read_source_config(source), source.config_path, tokens["[PAD]"], layer_norm_eps)
    tokenizer = build_tokenizer(tokens, config, _lower_case(source, do_lower_case))
    weights = (read_static_weights if source.format == "static" else read_paddlenlp_weights)(source, config)
    add_missing_nsp_head(weights, config)
    config.tie_word_embeddings = weights.tie_word_embeddings
    if source.format == "paddlenlp" and layer_norm_eps == ORIGINAL_LAYER_NORM_EPS:
        weights.notes.append("layer_norm_eps is 1e-5, the original graph's (PaddleNLP's config value is not used)")
    for note in weights.notes:
        logger.info(f"note: {note}")
    with atomic_output_dir(out, overwrite) as staging:
        logger.info(f"writing {len(weights.state)} tensors")
        write_model_folder(staging, ErnieForPreTraining, config, weights.state, processor=tokenizer,
                           source=str(source.weights_path))
        parity = []
        if reference is not None:
            assert reference_tensors is not None  # loaded with the reference above
            logger.info(f"comparing with the original's outputs in {reference}")
            parity = compare_with_reference(ErnieForPreTraining.from_pretrained(staging), reference_tensors, reference,
                                            reference_outputs)
            require_parity(parity, reference)
        repo_id = push_to_hub or Path(out).name
        write_model_card(
            staging, ENTRY.card_template,
            card_data(license="apache-2.0", tags=["ernie", "ernie-2.0", "fill-mask"], pipeline_tag="fill-mask"),
            model_name=Path(out).name, repo_id=repo_id, config=config, source_format=source.describe(),
            original_layer_norm_eps=layer_norm_eps == ORIGINAL_LAYER_NORM_EPS, hf_ext_version=__version__,
            source_files=source_files(source, checksums), parity=parity,
            notes=weights.notes,
        )
    logger.info(f"wrote {out}")
    if push_to_hub:
        push_folder(out, push_to_hub, token=token, private=private)
    return parity


CONVERT_NAME = "ernie2"  # hf-ext convert ernie2
CONVERT_SUMMARY = ("ERNIE 2.0 PaddlePaddle checkpoints (static release or PaddleNLP), without paddle")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`hf-ext convert ernie2` arguments (also used by conversion/convert_ernie2_paddle_checkpoint.py)."""
    parser.add_argument("src", help="Paddle static release folder (params/, ernie_config.json, vocab.txt) or "
                        "PaddleNLP folder (model_state.pdparams, config.json, vocab.txt), or the .pdparams file")
    parser.add_argument("out", help="folder to write (must not exist unless --overwrite)")
    parser.add_argument("--vocab", type=Path, help="vocab.txt to use (default: the one in SRC)")
    parser.add_argument("--do-lower-case", action=argparse.BooleanOptionalAction, default=None,
                        help="lower-case input text (default: the PaddleNLP tokenizer_config.json, else yes)")
    parser.add_argument("--layer-norm-eps", type=positive_float, default=ORIGINAL_LAYER_NORM_EPS,
                        help="LayerNorm epsilon (default 1e-5, the original graph's)")
    parser.add_argument("--checksums", action="store_true", help="also record the sha256 of every weight file in "
                        "the model card (reads the weights a second time)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> None:
    parity = convert_ernie2_checkpoint(
        args.src, args.out, vocab=args.vocab, do_lower_case=args.do_lower_case, layer_norm_eps=args.layer_norm_eps,
        reference=args.reference, checksums=args.checksums, overwrite=args.overwrite, push_to_hub=args.push_to_hub,
        private=args.private, token=args.token,
    )
    print_parity(parity)
