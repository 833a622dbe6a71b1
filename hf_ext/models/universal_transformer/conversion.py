"""Conversion of the PyTorch Universal Transformer re-implementation (andreamad8/Universal-Transformer-Pytorch, its
bAbI model `BabiUTransformer`) into a `UniversalTransformerForSequenceClassification` folder.

SRC is a folder with
- `state_dict.pt`: `torch.save(model.state_dict())` of a `BabiUTransformer`, read by torch's weights-only unpickler
  (a pickle that would run code is refused, not executed);
- `config.json`: the constructor arguments, as `{"constructor_kwargs": {...}, "post_construction_overrides": {...}}`
  (the layout the fixtures use) or as a bare `{argument: value}` object. The overrides are attributes the original
  lets one set after construction: `transformer_enc.act_fn.threshold` (the ACT threshold, 0.9 in its code) and
  `transformer_enc.act` (ACT on or off).

The encoder becomes the model's body (its behaviour is reached through config values: conv transition with the
trailing ReLU, unbiased-std layer norm, sinusoidal step signal, no final layer norm, no embedding scaling, the
embedding projection, threshold 0.9, every position transformed at every step) and the answer layer `W` (mean over
positions, then a linear map tied to the embeddings) becomes the classifier over `num_vocab` labels.
"""

import argparse
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

from ...checkpoints import load_state_dict
from ...conversion import (
    EXACT,
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
from ...errors import HfExtError
from ...export import empty_model, expected_tensors, file_record, write_model_folder
from ...text_files import read_json
from . import ENTRY, UniversalTransformerConfig, UniversalTransformerForSequenceClassification

logger = logging.get_logger(__name__)

WEIGHTS_FILE = "state_dict.pt"
CONFIG_FILE = "config.json"
REQUIRED_ARGUMENTS = ("num_vocab", "embedding_size", "hidden_size", "num_layers", "num_heads", "total_key_depth",
                      "total_value_depth", "filter_size")
# BabiUTransformer's keyword arguments and their defaults
OPTIONAL_ARGUMENTS = {"max_length": 71, "input_dropout": 0.0, "layer_dropout": 0.0, "attention_dropout": 0.0,
                      "relu_dropout": 0.0, "use_mask": False, "act": False}
THRESHOLD = 0.9  # ACT_basic.threshold = 1 - 0.1, hard-coded in the original
ACT_LOSS_WEIGHT = 0.001  # main.py's weight of the ponder cost
OVERRIDES = {"transformer_enc.act_fn.threshold": "act_threshold", "transformer_enc.act": "use_act"}
ENCODER_PREFIX = "universal_transformer.encoder."
# original key -> converted key (the halting unit only when ACT is on; the final layer norm only when applied)
KEY_MAP = {
    "emb.weight": "universal_transformer.embed_tokens.weight",
    "W.weight": "classifier.weight",
    "W.bias": "classifier.bias",
    "transformer_enc.embedding_proj.weight": ENCODER_PREFIX + "embedding_proj.weight",
    **{f"transformer_enc.enc.multi_head_attention.{name}_linear.weight":
       f"{ENCODER_PREFIX}layer.self_attn.{ours}_proj.weight"
       for name, ours in (("query", "q"), ("key", "k"), ("value", "v"), ("output", "o"))},
    **{f"transformer_enc.enc.positionwise_feed_forward.layers.{i}.conv.{kind}":
       f"{ENCODER_PREFIX}layer.transition.conv{i + 1}.{kind}"
       for i in (0, 1) for kind in ("weight", "bias")},
    **{f"transformer_enc.enc.layer_norm_{name}.{theirs}": f"{ENCODER_PREFIX}layer.{ours}_layer_norm.{kind}"
       for name, ours in (("mha", "self_attn"), ("ffn", "transition"))
       for theirs, kind in (("gamma", "weight"), ("beta", "bias"))},
}
HALTING_KEYS = {"transformer_enc.act_fn.p.weight": ENCODER_PREFIX + "halting.weight",
                "transformer_enc.act_fn.p.bias": ENCODER_PREFIX + "halting.bias"}
FINAL_NORM_KEYS = {"transformer_enc.layer_norm.gamma": ENCODER_PREFIX + "final_layer_norm.weight",
                   "transformer_enc.layer_norm.beta": ENCODER_PREFIX + "final_layer_norm.bias"}
BABI_MASK_KEY = "mask"  # bAbI's positional mask for bag-of-words sentence embeddings: input preparation


def looks_original(path: Path) -> bool:
    """Whether `path` is laid out as a folder of the re-implementation's model, by its file names: its state dict
    (state_dict.pt) beside its constructor arguments (config.json)."""
    return path.is_dir() and (path / WEIGHTS_FILE).is_file() and (path / CONFIG_FILE).is_file()


def read_arguments(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The constructor arguments and overrides from SRC/config.json, checked."""
    document = read_json(path, "constructor arguments")
    if not isinstance(document, dict):
        raise HfExtError(f"constructor arguments {path} must be a JSON object")
    arguments = document.get("constructor_kwargs", document)
    overrides = (document.get("post_construction_overrides") or {}) if "constructor_kwargs" in document else {}
    if not isinstance(arguments, dict) or not isinstance(overrides, dict):
        raise HfExtError(f"constructor arguments {path}: constructor_kwargs and post_construction_overrides must be "
                         "JSON objects")
    missing = [name for name in REQUIRED_ARGUMENTS if name not in arguments]
    if missing:
        raise HfExtError(f"constructor arguments {path} lack {', '.join(missing)}")
    unknown = sorted(set(arguments) - set(REQUIRED_ARGUMENTS) - set(OPTIONAL_ARGUMENTS))
    if unknown:
        raise HfExtError(f"constructor arguments {path}: unknown BabiUTransformer argument(s) {', '.join(unknown)}")
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise HfExtError(f"constructor arguments {path}: unsupported override(s) {', '.join(unknown)} "
                         f"(supported: {', '.join(OVERRIDES)})")
    return {**OPTIONAL_ARGUMENTS, **arguments}, overrides


def build_config(arguments: dict[str, Any], overrides: dict[str, Any], final_layer_norm: bool = False,
                 ) -> UniversalTransformerConfig:
    """`UniversalTransformerConfig` that reproduces the original's encoder and answer layer."""
    hidden = arguments["hidden_size"]
    if arguments["embedding_size"] != hidden:
        raise HfExtError(f"embedding_size {arguments['embedding_size']} differs from hidden_size {hidden}: the "
                         "original builds its embedding projection only for equal sizes and cannot run this model")
    values = {"use_act": bool(arguments["act"]), "act_threshold": THRESHOLD}
    values.update({OVERRIDES[name]: value for name, value in overrides.items()})
    if values["use_act"] and not arguments["act"]:
        raise HfExtError("the override transformer_enc.act=true needs a model constructed with act=true (the "
                         "original has no halting unit otherwise)")
    try:
        return UniversalTransformerConfig(
            vocab_size=arguments["num_vocab"], hidden_size=hidden, embedding_size=arguments["embedding_size"],
            project_embeddings=True, scale_embeddings=False, num_attention_heads=arguments["num_heads"],
            attention_key_depth=arguments["total_key_depth"] or hidden,
            attention_value_depth=arguments["total_value_depth"] or hidden, intermediate_size=arguments["filter_size"],
            transition="conv", num_steps=arguments["num_layers"], act_max_steps=arguments["num_layers"],
            act_loss_weight=ACT_LOSS_WEIGHT, act_halted_state="transformed", step_signal="sinusoid",
            layer_norm_type="unbiased_std", final_layer_norm=final_layer_norm,
            hidden_dropout_prob=arguments["layer_dropout"], input_dropout=arguments["input_dropout"],
            attention_dropout=arguments["attention_dropout"], relu_dropout=arguments["relu_dropout"],
            label_smoothing=0.0, classifier_pooling="mean", classifier_dropout=0.0, num_labels=arguments["num_vocab"],
            is_encoder_decoder=False, **values,
        )
    except (ValueError, TypeError) as error:
        raise HfExtError(f"bad model arguments: {error}") from None


def convert_state_dict(state: dict[str, torch.Tensor], config: UniversalTransformerConfig, source: str | Path,
                       has_halting_unit: bool) -> dict[str, torch.Tensor]:
    """Rename the original weights (of a model built with ACT when `has_halting_unit`); one clear error for missing
    or unexpected keys and for shapes that disagree with the constructor arguments."""
    original_keys = {**KEY_MAP, **FINAL_NORM_KEYS, **(HALTING_KEYS if has_halting_unit else {})}
    # the final norm is never applied by the original; the halting unit is unused once ACT is switched off
    mapping = {original: converted for original, converted in original_keys.items()
               if (original not in FINAL_NORM_KEYS or config.final_layer_norm)
               and (original not in HALTING_KEYS or config.use_act)}
    missing = sorted(set(original_keys) - set(state))
    if missing:
        raise HfExtError(f"{source}: missing {len(missing)} weight(s) of a BabiUTransformer"
                         f"{' with ACT' if has_halting_unit else ''}: {', '.join(missing)}")
    # the bAbI sentence mask is input preparation, not part of the transformers model (see the model card's notes)
    unexpected = sorted(set(state) - set(original_keys) - {BABI_MASK_KEY})
    if unexpected:
        hint = " (ACT weights, but the constructor arguments switch ACT off)" \
            if set(unexpected) <= set(HALTING_KEYS) else ""
        raise HfExtError(f"{source}: unexpected weight(s) {', '.join(unexpected)}{hint}")
    expected = expected_tensors(empty_model(UniversalTransformerForSequenceClassification, config))
    for original, converted in mapping.items():
        if tuple(state[original].shape) != expected[converted]:
            raise HfExtError(f"{source}: {original} has shape {tuple(state[original].shape)}, the constructor "
                             f"arguments imply {expected[converted]}")
    converted_state = {converted: state[original] for original, converted in mapping.items()}
    # the original ties W to the embeddings; here the classifier is its own parameter
    converted_state["classifier.weight"] = converted_state["classifier.weight"].clone()
    return converted_state


# the original's outputs a `--reference` file may hold, each with its tolerance (the fixture's: float tensors within
# atol 1e-4 / rtol 1e-4, the number of steps each position ran exactly)
FLOAT_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-4)
REFERENCE_TOLERANCES = {
    **{name: FLOAT_TOLERANCE for name in (
        "act_encoder_last_hidden_state", "fixed_encoder_last_hidden_state", "act_logits", "fixed_logits",
        "act_encoder_last_hidden_state_with_unused_final_layer_norm", "act_remainders", "act_ponder_cost")},
    "act_n_updates": EXACT,
}


def reference_outputs(model: UniversalTransformerForSequenceClassification, reference: dict[str, torch.Tensor],
                      ) -> dict[str, Compared]:
    """The converted model's outputs beside tensors the original computed (the fixtures' reference.safetensors: from
    `encoder_inputs_embeds`, the ACT and fixed-depth encoder outputs, halting pattern, ponder cost and logits)."""
    with torch.no_grad():
        outputs = model(inputs_embeds=reference["encoder_inputs_embeds"])
        body = model.universal_transformer(inputs_embeds=reference["encoder_inputs_embeds"])
    prefix = "act_" if model.config.use_act else "fixed_"
    state_name = f"{prefix}encoder_last_hidden_state"
    if model.config.final_layer_norm:
        state_name = "act_encoder_last_hidden_state_with_unused_final_layer_norm"
    ours = {state_name: body.last_hidden_state, f"{prefix}logits": outputs.logits}
    if model.config.use_act:
        ours.update({"act_n_updates": body.n_updates, "act_remainders": body.remainders,
                     "act_ponder_cost": body.ponder_cost})
    return {name: Compared(value, reference[name], REFERENCE_TOLERANCES[name]) for name, value in ours.items()
            if name in reference}


def convert_universal_transformer_checkpoint(src: str | Path, out: str | Path, *, final_layer_norm: bool = False,
                                             reference: str | Path | None = None, overwrite: bool = False,
                                             push_to_hub: str | None = None, private: bool = False,
                                             token: str | None = None) -> list[ParityCheck]:
    """Convert SRC (state_dict.pt + config.json of a BabiUTransformer) into a model folder at `out`, written
    atomically, with a model card recording the source files and the parity measured; optionally push it.
    Returns the parity checks; a check beyond its tolerance fails the conversion (`HfExtError`, nothing written)."""
    from ... import __version__
    from ...hub import card_data, push_folder, write_model_card
    from ...output import atomic_output_dir, check_output_dir

    check_output_dir(out, overwrite)
    reference_tensors = load_reference(reference) if reference is not None else None
    src = Path(src)
    if not src.is_dir():
        raise HfExtError(f"source {src} {'is not a folder' if src.exists() else 'does not exist'} (expected a folder "
                         f"with {WEIGHTS_FILE} and {CONFIG_FILE})")
    arguments, overrides = read_arguments(src / CONFIG_FILE)
    config = build_config(arguments, overrides, final_layer_norm)
    logger.info(f"reading {src / WEIGHTS_FILE}")
    original = load_state_dict(src / WEIGHTS_FILE, "state dict")
    state = convert_state_dict(original, config, src / WEIGHTS_FILE, has_halting_unit=bool(arguments["act"]))
    notes = [f"`{BABI_MASK_KEY}` (shape {list(original[BABI_MASK_KEY].shape)}), bAbI's positional mask for "
             "bag-of-words sentence embeddings, belongs to the input preparation and is not part of the model: pass "
             "the sentence embeddings as `inputs_embeds`"] if BABI_MASK_KEY in original else []
    if final_layer_norm:
        notes.append("the encoder's final layer norm, which the original creates but never applies, is applied "
                     "(as tensor2tensor does): outputs differ from the original's")
    else:
        notes.append("the encoder's final layer norm is left out: the original creates it but never applies it")
    if arguments["act"] and not config.use_act:
        notes.append("ACT is switched off by the override transformer_enc.act=false: the halting unit is left out")
    if arguments["use_mask"]:
        notes.append("use_mask is ignored, as by the original's BabiUTransformer (its encoder never masks)")
    notes.append(f"the original's timing signal covers {arguments['max_length']} positions; the converted model "
                 "computes it for any length (equal values within that range)")
    with atomic_output_dir(out, overwrite) as staging:
        logger.info(f"writing {len(state)} tensors")
        write_model_folder(staging, UniversalTransformerForSequenceClassification, config, state, ENTRY.auto_map,
                           source=str(src / WEIGHTS_FILE))
        logger.info("checking the written folder")
        model = UniversalTransformerForSequenceClassification.from_pretrained(staging).eval()
        loaded = model.state_dict()
        parity = [exact_check("weights (round trip)",
                              max((loaded[k] - v).abs().max().item() for k, v in state.items()))]
        if reference_tensors is not None:
            assert reference is not None  # the tensors were read from it
            logger.info(f"comparing with the original's outputs in {reference}")
            parity += compare_with_reference(model, reference_tensors, reference, reference_outputs)
        require_parity(parity, reference)
        repo_id = push_to_hub or Path(out).name
        write_model_card(
            staging, ENTRY.card_template,
            # a classifier (the answer word over the vocabulary), but one that reads sentence embeddings and comes
            # without a tokenizer: no pipeline runs the folder, so the Hub's widget is turned off
            card_data(license="mit", tags=["universal-transformer", "adaptive-computation-time", "babi"],
                      pipeline_tag="text-classification", inference=False),
            model_name=Path(out).name, repo_id=repo_id, config=config, hf_ext_version=__version__,
            source_files=[file_record(src / WEIGHTS_FILE), file_record(src / CONFIG_FILE)], parity=parity,
            notes=notes,
        )
    logger.info(f"wrote {out}")
    if push_to_hub:
        push_folder(out, push_to_hub, token=token, private=private)
    return parity


CONVERT_NAME = "universal-transformer"  # hf-ext convert universal-transformer
CONVERT_SUMMARY = ("Universal Transformer checkpoints of the PyTorch re-implementation "
                   "(andreamad8/Universal-Transformer-Pytorch)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`hf-ext convert universal-transformer` arguments (also used by
    conversion/convert_universal_transformer_original_checkpoint.py)."""
    parser.add_argument("src", help=f"folder with the original's {WEIGHTS_FILE} (a BabiUTransformer state dict) and "
                        f"{CONFIG_FILE} (its constructor arguments)")
    parser.add_argument("out", help="folder to write (must not exist unless --overwrite)")
    parser.add_argument("--final-layer-norm", action="store_true", help="apply the encoder's final layer norm, which "
                        "the original creates but never applies (tensor2tensor applies one)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> None:
    parity = convert_universal_transformer_checkpoint(
        args.src, args.out, final_layer_norm=args.final_layer_norm, reference=args.reference,
        overwrite=args.overwrite, push_to_hub=args.push_to_hub, private=args.private, token=args.token,
    )
    print_parity(parity)


__all__ = ["add_arguments", "build_config", "convert_state_dict", "convert_universal_transformer_checkpoint",
           "read_arguments", "run"]
