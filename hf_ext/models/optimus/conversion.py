"""Conversion of original Optimus checkpoints (ChunyuanLI/Optimus) into an `OptimusModel` folder.

Sources:
- an output folder holding `checkpoint-encoder-N/` and `checkpoint-decoder-N/` (the highest common N, or `step`),
  or those two folders given explicitly;
- a `checkpoint-full-N/training.bin` (or its folder); the configs are read from the sibling encoder/decoder folders
  of the same step when present, otherwise inferred from the weight shapes.
"""

import argparse
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import safe_open
from transformers import BertConfig, BertTokenizer, GPT2Config, GPT2Tokenizer
from transformers.utils import logging

from ...checkpoints import load_state_dict, safe_torch_load
from ...conversion import (
    Compared,
    ParityCheck,
    Tolerance,
    add_output_arguments,
    compare_with_reference,
    exact_check,
    load_reference,
    print_parity,
    require_parity,
)
from ...errors import HfExtError, one_line
from ...export import file_record, write_model_folder
from ...text_files import read_json_object
from . import ENTRY, OptimusConfig, OptimusModel, OptimusProcessor

logger = logging.get_logger(__name__)

ARGS_FILE = "training_encoder_args.bin"  # the original writes the args under this name in both folders
WEIGHTS_FILE = "pytorch_model.bin"
BERT_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                    "type_vocab_size", "initializer_range", "layer_norm_eps")
GPT2_CONFIG_KEYS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
                    "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "initializer_range")
ENCODER_SIZING_KEYS = ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                       "embeddings.token_type_embeddings.weight", "encoder.layer.0.intermediate.dense.weight")
DECODER_SIZING_KEYS = ("transformer.wte.weight", "transformer.wpe.weight")
DECODER_BUFFERS = re.compile(r"^transformer\.h\.\d+\.attn\.(bias|masked_bias)$")


@dataclass
class OptimusSource:
    """Where the original files are."""

    encoder_dir: Path | None = None
    decoder_dir: Path | None = None
    full_checkpoint: Path | None = None

    def files(self) -> list[Path]:
        """Every original file the conversion reads (for the provenance record)."""
        paths = []
        for folder in (self.encoder_dir, self.decoder_dir):
            if folder is not None:
                paths += [p for p in sorted(folder.iterdir()) if p.is_file()]
        if self.full_checkpoint is not None:
            paths.append(self.full_checkpoint)
        return paths

    def folders(self) -> tuple[Path, Path]:
        """The encoder and decoder checkpoint folders (`find_source` sets both, or a full checkpoint)."""
        if self.encoder_dir is None or self.decoder_dir is None:
            raise HfExtError(f"source {self.full_checkpoint} has no checkpoint-encoder-N/ and checkpoint-decoder-N/ "
                             "folders")
        return self.encoder_dir, self.decoder_dir


@dataclass
class OptimusOriginal:
    """What was read from the original files."""

    encoder_state: dict
    decoder_state: dict
    encoder_config: dict
    decoder_config: dict
    args: argparse.Namespace | None
    source: OptimusSource
    notes: list = field(default_factory=list)


def _step_folders(root, kind):
    found = {}
    for path in root.glob(f"checkpoint-{kind}-*"):
        match = re.fullmatch(rf"checkpoint-{kind}-(\d+)", path.name)
        if match and path.is_dir():
            found[int(match.group(1))] = path
    return found


def looks_original(path: Path) -> bool:
    """Whether `path` is laid out as the original's output, by its file names (what `find_source` reads):
    checkpoint-encoder-N/ and checkpoint-decoder-N/ or checkpoint-full-N/ folders, one checkpoint-full-N folder, or
    its training.bin."""
    if path.is_file():
        return path.name == "training.bin"
    return path.is_dir() and ((path / "training.bin").is_file() or bool(_step_folders(path, "full"))
                              or bool(set(_step_folders(path, "encoder")) & set(_step_folders(path, "decoder"))))


def find_source(src: str | Path | None = None, encoder_dir: str | Path | None = None,
                decoder_dir: str | Path | None = None, step: int | None = None) -> OptimusSource:
    """Resolve SRC (or the two explicit folders) to the original files."""
    if encoder_dir is not None or decoder_dir is not None:
        if encoder_dir is None or decoder_dir is None:
            raise HfExtError("give both --encoder and --decoder checkpoint folders, or neither")
        encoder, decoder = Path(encoder_dir), Path(decoder_dir)
        for folder in (encoder, decoder):
            if not folder.is_dir():
                raise HfExtError(f"checkpoint folder {folder} does not exist")
        return OptimusSource(encoder_dir=encoder, decoder_dir=decoder)
    if src is None:
        raise HfExtError("no source given: pass SRC or --encoder and --decoder")
    src = Path(src)
    if not src.exists():
        raise HfExtError(f"source {src} does not exist")
    if src.is_file():
        return OptimusSource(full_checkpoint=src)
    if (src / "training.bin").is_file():
        return OptimusSource(full_checkpoint=src / "training.bin")
    encoders, decoders = _step_folders(src, "encoder"), _step_folders(src, "decoder")
    common = sorted(set(encoders) & set(decoders))
    if step is not None:
        if step in common:
            return OptimusSource(encoder_dir=encoders[step], decoder_dir=decoders[step])
        full = src / f"checkpoint-full-{step}" / "training.bin"
        if full.is_file():
            return OptimusSource(full_checkpoint=full)
        raise HfExtError(f"source {src} has no checkpoint for step {step}")
    if common:
        return OptimusSource(encoder_dir=encoders[common[-1]], decoder_dir=decoders[common[-1]])
    fulls = {n: p / "training.bin" for n, p in _step_folders(src, "full").items() if (p / "training.bin").is_file()}
    if fulls:
        return OptimusSource(full_checkpoint=fulls[max(fulls)])
    if not any(src.iterdir()):
        raise HfExtError(f"source {src} is empty")
    raise HfExtError(f"source {src} holds no Optimus checkpoint (expected checkpoint-encoder-N/ and "
                     "checkpoint-decoder-N/, or checkpoint-full-N/training.bin)")


def _load_args(path):
    args = safe_torch_load(path, "training args")
    if not isinstance(args, argparse.Namespace):
        raise HfExtError(f"training args {path} do not hold an argparse.Namespace")
    return args


def read_original(source: OptimusSource) -> OptimusOriginal:
    """Read the weights, configs and training args of an original checkpoint."""
    args = None
    notes = []
    if source.full_checkpoint is not None:
        logger.info(f"reading {source.full_checkpoint}")
        checkpoint = safe_torch_load(source.full_checkpoint, "checkpoint")
        if not isinstance(checkpoint, dict) or "model_state_dict" not in checkpoint:
            raise HfExtError(f"checkpoint {source.full_checkpoint} is not an Optimus training.bin "
                             "(no model_state_dict)")
        state = checkpoint["model_state_dict"]
        args = checkpoint.get("args")
        encoder_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        decoder_state = {k[len("decoder."):]: v for k, v in state.items() if k.startswith("decoder.")}
        if not encoder_state or not decoder_state:
            raise HfExtError(f"checkpoint {source.full_checkpoint} lacks encoder.* or decoder.* weights: "
                             "not an Optimus VAE")
        # the configs live beside the full checkpoint in the same step's encoder/decoder folders
        match = re.fullmatch(r"checkpoint-full-(\d+)", source.full_checkpoint.parent.name)
        root = source.full_checkpoint.parent.parent
        if match:
            enc_dir = root / f"checkpoint-encoder-{match.group(1)}"
            dec_dir = root / f"checkpoint-decoder-{match.group(1)}"
            if (enc_dir / "config.json").is_file() and (dec_dir / "config.json").is_file():
                source.encoder_dir, source.decoder_dir = enc_dir, dec_dir
    else:
        encoder_dir, decoder_dir = source.folders()
        for folder in (encoder_dir, decoder_dir):
            if not (folder / WEIGHTS_FILE).is_file():
                raise HfExtError(f"checkpoint folder {folder} has no {WEIGHTS_FILE}")
        logger.info(f"reading {encoder_dir / WEIGHTS_FILE}")
        encoder_state = load_state_dict(encoder_dir / WEIGHTS_FILE, "encoder weights")
        logger.info(f"reading {decoder_dir / WEIGHTS_FILE}")
        decoder_state = load_state_dict(decoder_dir / WEIGHTS_FILE, "decoder weights")
        for folder in (encoder_dir, decoder_dir):
            if args is None and (folder / ARGS_FILE).is_file():
                args = _load_args(folder / ARGS_FILE)

    _check_is_optimus(encoder_state, decoder_state, source)
    # exists(), not is_file(): a FIFO or device named config.json is refused by read_json_object, not taken for no
    # config
    if source.encoder_dir is not None and (source.encoder_dir / "config.json").exists():
        encoder_dir, decoder_dir = source.folders()
        encoder_config = read_json_object(encoder_dir / "config.json", "encoder config")
        decoder_config = read_json_object(decoder_dir / "config.json", "decoder config")
    else:
        encoder_config, decoder_config = _infer_configs(encoder_state, decoder_state)
        notes.append("encoder/decoder configs inferred from weight shapes (64-dim attention heads)")
    if args is not None and not isinstance(args, argparse.Namespace):
        raise HfExtError("the checkpoint's args are not an argparse.Namespace")
    return OptimusOriginal(encoder_state, decoder_state, encoder_config, decoder_config, args, source, notes)


def _check_is_optimus(encoder_state, decoder_state, source):
    if any(k.startswith("bert.") for k in encoder_state) or "linear.weight" not in encoder_state:
        raise HfExtError(f"{source.full_checkpoint or source.encoder_dir}: the encoder weights are not an Optimus "
                         "encoder (no latent projection linear.weight; a plain BERT checkpoint?)")
    if "transformer.linear.weight" not in decoder_state or "transformer.linear_emb.weight" not in decoder_state:
        raise HfExtError(f"{source.full_checkpoint or source.decoder_dir}: the decoder weights are not an Optimus "
                         "decoder (no transformer.linear / linear_emb latent projections; a plain GPT-2 checkpoint?)")
    # the sizes are read off these before the full key check, so their absence must not surface as a KeyError
    for side, state, keys, folder in (("encoder", encoder_state, ENCODER_SIZING_KEYS, source.encoder_dir),
                                      ("decoder", decoder_state, DECODER_SIZING_KEYS, source.decoder_dir)):
        missing = [key for key in keys if key not in state]
        if missing:
            raise HfExtError(f"{source.full_checkpoint or folder}: the {side} weights lack {', '.join(missing)} "
                             "(missing keys)")


def _infer_configs(encoder_state, decoder_state):
    """Sizes from shapes; heads follow BERT's and GPT-2's 64-dim convention, which weights cannot show."""
    hidden = encoder_state["embeddings.word_embeddings.weight"].shape[1]
    n_embd = decoder_state["transformer.wte.weight"].shape[1]
    for name, size in (("encoder", hidden), ("decoder", n_embd)):
        if size % 64:
            raise HfExtError(f"cannot infer the {name}'s attention heads from its weights (hidden size {size} is not "
                             "a multiple of 64); convert from the checkpoint-encoder/decoder folders, which hold "
                             "config.json")
    enc_layers = len({k.split(".")[2] for k in encoder_state if k.startswith("encoder.layer.")})
    dec_layers = len({k.split(".")[2] for k in decoder_state if k.startswith("transformer.h.")})
    encoder = {
        "vocab_size": encoder_state["embeddings.word_embeddings.weight"].shape[0], "hidden_size": hidden,
        "num_hidden_layers": enc_layers, "num_attention_heads": hidden // 64,
        "intermediate_size": encoder_state["encoder.layer.0.intermediate.dense.weight"].shape[0],
        "max_position_embeddings": encoder_state["embeddings.position_embeddings.weight"].shape[0],
        "type_vocab_size": encoder_state["embeddings.token_type_embeddings.weight"].shape[0],
    }
    decoder = {
        "vocab_size": decoder_state["transformer.wte.weight"].shape[0], "n_embd": n_embd, "n_layer": dec_layers,
        "n_head": n_embd // 64, "n_positions": decoder_state["transformer.wpe.weight"].shape[0],
    }
    return encoder, decoder


def _flag(value):
    return None if value is None else bool(int(value))


def build_config(original: OptimusOriginal, latent_as_gpt_memory: int | bool | None = None,
                 latent_as_gpt_emb: int | bool | None = None, special_ids: dict[str, int] | None = None,
                 ) -> OptimusConfig:
    """The `OptimusConfig` of an original checkpoint: sizes from its configs and weights, flags and loss settings
    from its training args (explicit flags win)."""
    enc_state, dec_state, args = original.encoder_state, original.decoder_state, original.args
    latent_rows = enc_state["linear.weight"].shape[0]
    if latent_rows % 2:
        raise HfExtError(f"encoder linear.weight has {latent_rows} rows, expected 2 x latent_size")
    latent_size = latent_rows // 2
    decoder_latent = dec_state["transformer.linear_emb.weight"].shape[1]
    if decoder_latent != latent_size:
        raise HfExtError(f"latent sizes disagree: the encoder produces {latent_size}, the decoder reads "
                         f"{decoder_latent}")
    configured = original.decoder_config.get("latent_size")
    if configured is not None and configured != latent_size:
        raise HfExtError(f"latent sizes disagree: decoder config.json says {configured}, the weights say "
                         f"{latent_size}")
    if args is not None and getattr(args, "latent_size", latent_size) != latent_size:
        raise HfExtError(f"latent sizes disagree: the training args say {args.latent_size}, the weights say "
                         f"{latent_size}")

    decoder_kwargs = {k: original.decoder_config[k] for k in GPT2_CONFIG_KEYS if k in original.decoder_config}
    vocab_size = decoder_kwargs.get("vocab_size", dec_state["transformer.wte.weight"].shape[0])
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise HfExtError(f"{_config_files(original.source)}: decoder vocab_size must be an integer, got {vocab_size!r}")
    # the original adds <PAD>, <BOS>, <EOS> last, in that order
    ids: dict[str, Any] = special_ids or {"pad_token_id": vocab_size - 3, "bos_token_id": vocab_size - 2,
                          "eos_token_id": vocab_size - 1}

    def arg(name, default):
        value = getattr(args, name, default) if args is not None else default
        return value.item() if hasattr(value, "item") else value

    memory = _flag(latent_as_gpt_memory) if latent_as_gpt_memory is not None else _flag(arg("latent_as_gpt_memory", 1))
    emb = _flag(latent_as_gpt_emb) if latent_as_gpt_emb is not None else _flag(arg("latent_as_gpt_emb", 1))
    head, embedding = dec_state.get("lm_head.weight"), dec_state["transformer.wte.weight"]
    # torch.save keeps tied tensors as one storage; the comparison is for files that stored two copies
    tied = head is None or head.data_ptr() == embedding.data_ptr() or torch.equal(head, embedding)
    try:
        return OptimusConfig(
            encoder=BertConfig(**{k: original.encoder_config[k] for k in BERT_CONFIG_KEYS
                                  if k in original.encoder_config}),
            decoder=GPT2Config(**decoder_kwargs, **ids),
            latent_size=latent_size,
            latent_as_gpt_memory=memory,
            latent_as_gpt_emb=emb,
            beta=float(arg("beta", 1.0)),
            fb_mode=2 if arg("use_deterministic_connect", False) else 1,
            dim_target_kl=float(arg("dim_target_kl", 3.0)),
            length_weighted_loss=bool(arg("length_weighted_loss", False)),
            tie_word_embeddings=tied,
        )
    except (ValueError, StrictDataclassError) as error:
        raise HfExtError(f"{_config_files(original.source)}: {one_line(error)}") from None


def _config_files(source):
    """Where the configs of a conversion come from, for error messages."""
    if source.encoder_dir is not None and (source.encoder_dir / "config.json").is_file():
        return f"config {source.encoder_dir / 'config.json'} or {source.decoder_dir / 'config.json'}"
    return f"the configs inferred from the weights of {source.full_checkpoint}"


def convert_state_dict(encoder_state: dict[str, torch.Tensor], decoder_state: dict[str, torch.Tensor],
                       ) -> dict[str, torch.Tensor]:
    """Original key names -> `OptimusModel` key names (tensors are shared, not copied)."""
    state = {}
    for key, tensor in encoder_state.items():
        state["to_latent.weight" if key == "linear.weight" else f"encoder.{key}"] = tensor
    for key, tensor in decoder_state.items():
        if DECODER_BUFFERS.match(key):
            continue  # causal-mask buffers, rebuilt by the model
        if key == "transformer.linear.weight":
            state["latent_to_memory.weight"] = tensor
        elif key == "transformer.linear_emb.weight":
            state["latent_to_embedding.weight"] = tensor
        elif key.startswith("transformer."):
            state["decoder." + key[len("transformer."):]] = tensor
        else:
            state[key] = tensor
    return state


def load_processor(source: OptimusSource, encoder_tokenizer: str | Path | None = None,
                   decoder_tokenizer: str | Path | None = None, do_lower_case: bool | None = None,
                   ) -> OptimusProcessor | None:
    """Both tokenizers from the given folders, or from the checkpoint folders; None when neither has them."""
    enc_dir = Path(encoder_tokenizer) if encoder_tokenizer else source.encoder_dir
    dec_dir = Path(decoder_tokenizer) if decoder_tokenizer else source.decoder_dir
    have_enc = enc_dir is not None and (enc_dir / "vocab.txt").is_file()
    have_dec = dec_dir is not None and (dec_dir / "vocab.json").is_file() and (dec_dir / "merges.txt").is_file()
    for given, present, what in ((encoder_tokenizer, have_enc, "vocab.txt"),
                                 (decoder_tokenizer, have_dec, "vocab.json and merges.txt")):
        if given and not present:
            raise HfExtError(f"tokenizer folder {given} has no {what}")
    if not (have_enc and have_dec):
        return None
    assert enc_dir is not None and dec_dir is not None  # both hold their tokenizer files
    lower = do_lower_case
    if lower is None:
        tokenizer_config = enc_dir / "tokenizer_config.json"
        lower = bool(read_json_object(tokenizer_config, "tokenizer config").get("do_lower_case", False)) \
            if tokenizer_config.is_file() else False
    bert = BertTokenizer(vocab=str(enc_dir / "vocab.txt"), do_lower_case=lower)
    gpt2 = GPT2Tokenizer(vocab=str(dec_dir / "vocab.json"), merges=str(dec_dir / "merges.txt"))
    OptimusProcessor.add_decoder_special_tokens(gpt2)
    return OptimusProcessor(tokenizer=bert, decoder_tokenizer=gpt2)


def convert(original: OptimusOriginal, staging: Path, processor: OptimusProcessor | None = None,
            latent_as_gpt_memory: int | bool | None = None, latent_as_gpt_emb: int | bool | None = None,
            ) -> OptimusConfig:
    """Write the converted model into `staging`; returns its config."""
    special_ids = None
    if processor is not None:
        dec = processor.decoder_tokenizer
        special_ids = {"pad_token_id": dec.pad_token_id, "bos_token_id": dec.bos_token_id,
                       "eos_token_id": dec.eos_token_id}
    config = build_config(original, latent_as_gpt_memory, latent_as_gpt_emb, special_ids)
    if processor is not None and len(processor.decoder_tokenizer) != config.decoder.vocab_size:
        raise HfExtError(f"the decoder tokenizer has {len(processor.decoder_tokenizer)} tokens with <PAD>/<BOS>/<EOS>, "
                         f"the decoder weights {config.decoder.vocab_size}")
    state = convert_state_dict(original.encoder_state, original.decoder_state)
    source = str(original.source.full_checkpoint or original.source.folders()[0].parent)
    logger.info(f"writing {len(state)} tensors")
    write_model_folder(staging, OptimusModel, config, state, ENTRY.auto_map, processor=processor, source=source)
    return config


def to_original_state_dicts(state: dict[str, torch.Tensor], tie_word_embeddings: bool = True,
                            ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`OptimusModel` keys -> the original's (encoder, decoder) state dicts; the inverse of `convert_state_dict`."""
    encoder, decoder = {}, {}
    for key, tensor in state.items():
        if key == "to_latent.weight":
            encoder["linear.weight"] = tensor
        elif key.startswith("encoder."):
            encoder[key[len("encoder."):]] = tensor
        elif key == "latent_to_memory.weight":
            decoder["transformer.linear.weight"] = tensor
        elif key == "latent_to_embedding.weight":
            decoder["transformer.linear_emb.weight"] = tensor
        elif key.startswith("decoder."):
            decoder["transformer." + key[len("decoder."):]] = tensor
        else:
            decoder[key] = tensor
    if tie_word_embeddings or "lm_head.weight" not in decoder:
        decoder["lm_head.weight"] = decoder["transformer.wte.weight"]
    return encoder, decoder


# the original's outputs a `--reference` file may hold, each with its tolerance (float32; the fixture's: atol 1e-5)
REFERENCE_TOLERANCES = {name: Tolerance(atol=1e-5) for name in ("enc_last_hidden", "enc_pooled", "mean", "logvar",
                                                                "dec_logits", "loss_rec")}


def reference_outputs(model: OptimusModel, reference: dict[str, torch.Tensor]) -> dict[str, Compared]:
    """The converted model's outputs beside the original's (the fixtures' layout: `enc_input_ids`, `dec_labels`,
    `z` in; encoder outputs, posterior, logits and losses out)."""
    model.eval()
    with torch.no_grad():
        mean, logvar, encoder_outputs = model.encode(reference["enc_input_ids"])
        outputs = model(labels=reference["dec_labels"], latent_z=reference.get("z", mean))
    ours = {"enc_last_hidden": encoder_outputs.last_hidden_state, "enc_pooled": encoder_outputs.pooler_output,
            "mean": mean, "logvar": logvar, "dec_logits": outputs.logits, "loss_rec": outputs.loss_rec}
    return {name: Compared(value, reference[name], REFERENCE_TOLERANCES[name]) for name, value in ours.items()
            if name in reference}


def round_trip_error(path: str | Path, written: dict[str, torch.Tensor], block_bytes: int = 32 << 20) -> float:
    """Max abs difference between the tensors stored in the safetensors file at `path` and `written`, emptying
    `written` as it goes (names absent from the file are tied copies, which are not stored).

    Memory stays near one copy of the checkpoint: the file is read through a series of memory maps, each closed
    (its pages leave this process) before the next, over groups of tensors of about `block_bytes`, smallest first
    so that the originals released make room for the larger tensors still to come; a larger tensor has a map of its
    own and is compared in blocks of rows."""
    with safe_open(path, "pt") as stored:
        names = sorted(stored.keys(), key=lambda name: _nbytes(written[name]))
    groups: list[list[str]] = [[]]
    group_bytes = 0
    for name in names:
        if groups[-1] and group_bytes + _nbytes(written[name]) > block_bytes:
            groups.append([])
            group_bytes = 0
        groups[-1].append(name)
        group_bytes += _nbytes(written[name])
    error = 0.0
    for group in groups:
        with safe_open(path, "pt") as stored:
            for name in group:
                error = max(error, _max_difference(stored.get_slice(name), written.pop(name), block_bytes))
    written.clear()
    return error


def _nbytes(tensor):
    return tensor.numel() * tensor.element_size()


def _max_difference(stored, tensor, block_bytes):
    """Max abs difference between a stored tensor (a safetensors slice) and `tensor`, a block of rows at a time."""
    if tensor.dim() == 0:
        return (stored[...] - tensor).abs().item()
    rows = max(1, block_bytes // max(1, tensor[0:1].numel() * tensor.element_size()))
    error = 0.0
    for start in range(0, len(tensor), rows):
        read, kept = stored[start:min(start + rows, len(tensor))], tensor[start:start + rows]
        if not torch.equal(read, kept):
            error = max(error, (read - kept).abs().max().item())
    return error


def _loading_problems(info):
    """What `from_pretrained(..., output_loading_info=True)` reports as not loaded cleanly, as one text."""
    return "; ".join(f"{kind.replace('_', ' ')}: {', '.join(map(str, keys))}"
                     for kind, keys in info.items() if keys and kind != "error_msgs") or \
        "; ".join(info.get("error_msgs", []))


def convert_optimus_checkpoint(src: str | Path | None = None, out: str | Path | None = None, *,
                               encoder_dir: str | Path | None = None, decoder_dir: str | Path | None = None,
                               step: int | None = None, encoder_tokenizer: str | Path | None = None,
                               decoder_tokenizer: str | Path | None = None,
                               latent_as_gpt_memory: int | bool | None = None,
                               latent_as_gpt_emb: int | bool | None = None, reference: str | Path | None = None,
                               overwrite: bool = False, push_to_hub: str | None = None, private: bool = False,
                               token: str | None = None) -> list[ParityCheck]:
    """Convert an original Optimus checkpoint into a model folder at `out` (written atomically), with a model card
    that records the source files and the parity measured; optionally push it. Returns the parity checks; a check
    beyond its tolerance fails the conversion (`HfExtError`, nothing written)."""
    from ... import __version__
    from ...hub import card_data, push_folder, write_model_card
    from ...output import atomic_output_dir, check_output_dir

    if out is None:
        raise TypeError("convert_optimus_checkpoint() needs `out`, the folder to write")
    check_output_dir(out, overwrite)
    reference_tensors = load_reference(reference) if reference is not None else None
    source = find_source(src, encoder_dir, decoder_dir, step)
    # hashing ~1 GB of sources takes as long as reading them; it runs beside the conversion (hashlib frees the GIL)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256") as hashing:
        files = hashing.submit(lambda: [file_record(p, str(p.relative_to(p.parent.parent))) for p in source.files()])
        original = read_original(source)
        lower = getattr(original.args, "do_lower_case", None)
        processor = load_processor(source, encoder_tokenizer, decoder_tokenizer, do_lower_case=lower)
        if processor is None:
            original.notes.append("no tokenizer files found: the folder holds no processor")
            logger.warning("no tokenizer files in the checkpoint folders "
                           "(give --encoder-tokenizer/--decoder-tokenizer)")
        with atomic_output_dir(out, overwrite) as staging:
            config = convert(original, staging, processor, latent_as_gpt_memory, latent_as_gpt_emb)
            logger.info("checking the written folder")
            # with output_loading_info, from_pretrained returns the model and what loaded (transformers annotates the
            # model alone)
            model, loading = cast(tuple[OptimusModel, dict[str, Any]],
                                  OptimusModel.from_pretrained(staging, output_loading_info=True))
            if _loading_problems(loading):
                raise HfExtError(f"the written folder does not load cleanly ({_loading_problems(loading)})")
            written = convert_state_dict(original.encoder_state, original.decoder_state)
            original.encoder_state.clear()  # `written` now holds the only references; the check releases them
            original.decoder_state.clear()
            parity = [exact_check("weights (round trip)", round_trip_error(staging / "model.safetensors", written))]
            if reference is not None:
                assert reference_tensors is not None  # loaded with the reference above
                logger.info(f"comparing with the original's outputs in {reference}")
                parity += compare_with_reference(model.eval(), reference_tensors, reference, reference_outputs)
            require_parity(parity, reference)
            repo_id = push_to_hub or Path(out).name
            write_model_card(
                staging, ENTRY.card_template,
                card_data(license="mit", tags=["optimus", "vae", "text-generation"], pipeline_tag="text-generation",
                          base_model=_base_models(original.args)),
                model_name=Path(out).name, repo_id=repo_id, latent_size=config.latent_size,
                injection=_injection_text(config), encoder_layers=config.encoder.num_hidden_layers,
                encoder_hidden=config.encoder.hidden_size, decoder_layers=config.decoder.n_layer,
                decoder_hidden=config.decoder.n_embd, decoder_vocab=config.decoder.vocab_size, beta=config.beta,
                dim_target_kl=config.dim_target_kl, hf_ext_version=__version__, source_files=files.result(),
                parity=parity, notes=original.notes,
            )
    logger.info(f"wrote {out}")
    if push_to_hub:
        push_folder(out, push_to_hub, token=token, private=private)
    return parity


# the original's --*_model_name_or_path defaults, by their current Hub ids
LEGACY_HUB_IDS = {"bert-base-cased": "google-bert/bert-base-cased",
                  "bert-base-uncased": "google-bert/bert-base-uncased",
                  "bert-large-cased": "google-bert/bert-large-cased", "gpt2": "openai-community/gpt2",
                  "gpt2-medium": "openai-community/gpt2-medium", "gpt2-large": "openai-community/gpt2-large"}


def _base_models(args):
    """The Hub ids of the encoder and decoder the original training started from (paths are left out)."""
    names = [getattr(args, f"{side}_model_name_or_path", "") for side in ("encoder", "decoder")] if args else []
    ids = [LEGACY_HUB_IDS.get(name, name) for name in names if name]
    return [i for i in ids if re.fullmatch(r"[\w.-]+/[\w.-]+", i)] or None


def _injection_text(config):
    ways = [w for w, on in (("as a memory slot in every layer", config.latent_as_gpt_memory),
                            ("added to every token embedding", config.latent_as_gpt_emb)) if on]
    return " and ".join(ways) if ways else "nowhere (both injections are switched off)"


CONVERT_NAME = "optimus"  # hf-ext convert optimus
CONVERT_SUMMARY = "original Optimus checkpoints (ChunyuanLI/Optimus)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`hf-ext convert optimus` arguments (also used by conversion/convert_optimus_original_checkpoint.py)."""
    parser.add_argument("src", nargs="?", help="original output folder (checkpoint-encoder-N/ + checkpoint-decoder-N/ "
                        "or checkpoint-full-N/), a checkpoint-full-N folder, or a training.bin")
    parser.add_argument("out", help="folder to write (must not exist unless --overwrite)")
    parser.add_argument("--encoder", type=Path, help="checkpoint-encoder-N folder (with --decoder, instead of SRC)")
    parser.add_argument("--decoder", type=Path, help="checkpoint-decoder-N folder (with --encoder, instead of SRC)")
    parser.add_argument("--step", type=int, help="which step N to convert (default: the highest)")
    parser.add_argument("--encoder-tokenizer", type=Path, help="folder with the BERT vocab.txt (default: the "
                        "encoder checkpoint folder)")
    parser.add_argument("--decoder-tokenizer", type=Path, help="folder with the GPT-2 vocab.json and merges.txt "
                        "(default: the decoder checkpoint folder)")
    parser.add_argument("--latent-as-gpt-memory", type=int, choices=(0, 1),
                        help="override the memory injection flag read from the training args")
    parser.add_argument("--latent-as-gpt-emb", type=int, choices=(0, 1),
                        help="override the embedding injection flag read from the training args")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> None:
    parity = convert_optimus_checkpoint(
        args.src, args.out, encoder_dir=args.encoder, decoder_dir=args.decoder, step=args.step,
        encoder_tokenizer=args.encoder_tokenizer, decoder_tokenizer=args.decoder_tokenizer,
        latent_as_gpt_memory=args.latent_as_gpt_memory, latent_as_gpt_emb=args.latent_as_gpt_emb,
        reference=args.reference, overwrite=args.overwrite, push_to_hub=args.push_to_hub, private=args.private,
        token=args.token,
    )
    print_parity(parity)
