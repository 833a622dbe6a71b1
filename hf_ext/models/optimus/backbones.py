"""An Optimus built from two pretrained backbones (`hf-ext optimus init`): any bidirectional encoder and any
decoder-only causal language model whose layers keep a key/value cache, each a local folder or a Hub repo id.

The backbones' weights are copied unchanged (the decoder's embeddings grown, by mean resizing, for the special tokens
Optimus needs that its tokenizer lacks); the latent parts (`to_latent`, `latent_to_memory`, `latent_to_embedding`)
are freshly initialised: the model has to be trained (`hf-ext optimus train`) before its latent space means
anything.
"""

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import AutoModel, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import cached_file, logging

from ...errors import HfExtError, one_line
from ...loading import load_config, load_tokenizer, loading
from .configuration_optimus import OptimusConfig, check_decoder, check_encoder
from .modeling_optimus import OptimusModel
from .processing_optimus import DECODER_SPECIAL_TOKENS, OptimusProcessor

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel

logger = logging.get_logger(__name__)

# sentence-transformers' pooling modes (`1_Pooling/config.json`) that are one of Optimus' sentence features
SENTENCE_TRANSFORMERS_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
LATENT_MODULES = ("to_latent", "latent_to_memory", "latent_to_embedding")


def sentence_transformers_pooling(source: str) -> str | None:
    """The Optimus sentence feature ("mean" or "cls") that `source`'s sentence-transformers pooling computes, when
    `source` is a sentence-transformers model (a `modules.json` naming a Pooling module) pooling that way alone;
    None otherwise."""
    optional = {"_raise_exceptions_for_missing_entries": False, "_raise_exceptions_for_connection_errors": False}
    with loading("the sentence-transformers settings", source):
        modules_file = cached_file(source, "modules.json", **optional)
        if modules_file is None:
            return None
        modules = json.loads(Path(modules_file).read_text(encoding="utf-8"))
        pooling = next((module for module in modules if isinstance(module, dict)
                        and str(module.get("type", "")).endswith("Pooling")), None)
        if pooling is None:
            return None
        settings_file = cached_file(source, f"{pooling.get('path') or pooling['name']}/config.json", **optional)
        if settings_file is None:
            return None
        settings = json.loads(Path(settings_file).read_text(encoding="utf-8"))
    modes = [name for name, value in settings.items() if name.startswith("pooling_mode_") and value]
    return SENTENCE_TRANSFORMERS_POOLING.get(modes[0]) if len(modes) == 1 else None


def decoder_tokens_to_add(tokenizer: PreTrainedTokenizerBase) -> dict[str, str]:
    """The original's `<PAD>`, `<BOS>`, `<EOS>` (`OptimusProcessor.add_decoder_special_tokens`) that `tokenizer` needs
    for pad, BOS and EOS to be three different tokens: its own are kept where they are; a missing one is added; a BOS
    that is also the EOS (GPT-2's <|endoftext|>) gets both replaced, as the original does; a pad that is the BOS or
    the EOS (SmolLM2's, Qwen's) gets `<PAD>`."""
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    shared = bos is not None and bos == eos
    needed = {"pad_token": pad is None or pad in (bos, eos), "bos_token": bos is None or shared,
              "eos_token": eos is None or shared}
    return {name: token for name, token in DECODER_SPECIAL_TOKENS.items() if needed[name]}


def added_decoder_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids of the decoder's special tokens that are the original's `<PAD>`, `<BOS>`, `<EOS>`: the tokens `init`
    added (or a converted original's), whose embeddings no pretraining has learnt."""
    return sorted({getattr(tokenizer, f"{name}_id") for name, token in DECODER_SPECIAL_TOKENS.items()
                   if getattr(tokenizer, name) == token})


def _checked(check, config: PretrainedConfig, role: str, source: str) -> None:
    try:
        check(config)
    except ValueError as error:
        raise HfExtError(f"{role} {source}: {error}") from None


def _require_vocabulary(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig, role: str,
                        source: str) -> None:
    if len(tokenizer) > config.vocab_size:
        raise HfExtError(f"{role} {source}: its tokenizer has {len(tokenizer)} tokens but its model only "
                         f"{config.vocab_size} embeddings (a tokenizer of another model?)")


def _copy_weights(target: torch.nn.Module, source: torch.nn.Module, what: str, extra: tuple[str, ...] = ()) -> None:
    """Copy `source`'s weights into `target` (same architecture); `extra` prefixes name weights `target` lacks on
    purpose (an encoder's pooler where the sentence feature is not the pooler's)."""
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    unexpected = [name for name in unexpected if not name.startswith(extra)]
    if missing or unexpected:
        raise HfExtError(f"the {what} weights do not fit the model built from its config (missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]})")


def optimus_from_backbones(encoder: str, decoder: str, latent_size: int = 32, latent_as_gpt_memory: bool = True,
                           latent_as_gpt_emb: bool = True, encoder_pooling: str | None = None, seed: int = 0,
                           **config_kwargs: Any) -> tuple[OptimusModel, OptimusProcessor]:
    """An Optimus model and its processor built from a pretrained `encoder` and a pretrained causal LM `decoder`
    (folders or Hub repo ids): their weights and tokenizers, the decoder's with pad, BOS and EOS made three different
    tokens (`decoder_tokens_to_add`: added tokens get mean-resized embeddings), and freshly initialised latent
    projections (from `seed`). `encoder_pooling` defaults to what the encoder was trained for: the pooling of a
    sentence-transformers model ("mean" or "cls"), else its pooler where its checkpoint has one, else "mean".
    `config_kwargs` go to `OptimusConfig` (beta, dim_target_kl, ...). One `HfExtError` line for backbones in the wrong
    role, a decoder without a key/value cache, a tokenizer larger than its model's vocabulary or settings the
    config refuses, all checked before any weights are read, and for a "pooler" feature of an encoder whose
    checkpoint has no pretrained pooler."""
    encoder_config = load_config(encoder)
    _checked(check_encoder, encoder_config, "ENCODER", encoder)
    decoder_config = load_config(decoder)
    _checked(check_decoder, decoder_config, "DECODER", decoder)
    encoder_tokenizer, decoder_tokenizer = load_tokenizer(encoder), load_tokenizer(decoder)
    _require_vocabulary(encoder_tokenizer, encoder_config, "ENCODER", encoder)
    _require_vocabulary(decoder_tokenizer, decoder_config, "DECODER", decoder)
    if encoder_tokenizer.pad_token_id is None:
        raise HfExtError(f"ENCODER {encoder}: its tokenizer has no pad token, which batches of sentences need")
    if encoder_config.pad_token_id is None:  # builds the encoder mask where none is given
        encoder_config.pad_token_id = encoder_tokenizer.pad_token_id
    added = decoder_tokens_to_add(decoder_tokenizer)
    decoder_tokenizer.add_special_tokens(dict(added))
    if added:
        logger.info(f"added {', '.join(added.values())} to the decoder tokenizer (pad, BOS and EOS must be three "
                    "different tokens)")
    special_ids = {f"{name}_id": getattr(decoder_tokenizer, f"{name}_id")
                   for name in ("pad_token", "bos_token", "eos_token")}
    optimus_settings = dict(latent_size=latent_size, latent_as_gpt_memory=latent_as_gpt_memory,
                            latent_as_gpt_emb=latent_as_gpt_emb, **config_kwargs)
    # every setting checked now, before the weights are read, on the decoder config as it will be
    grown = copy.deepcopy(decoder_config)
    grown.update({**special_ids, "vocab_size": max(decoder_config.vocab_size, len(decoder_tokenizer))})
    try:
        OptimusConfig(encoder=encoder_config, decoder=grown, encoder_pooling=encoder_pooling or "mean",
                      **optimus_settings)
    except ValueError as error:
        raise HfExtError(str(error)) from None

    with loading("the encoder", encoder):
        # with output_loading_info, from_pretrained returns the model and what loaded (annotated as the model alone)
        encoder_model, encoder_loading = cast(tuple[PreTrainedModel, dict[str, Any]], AutoModel.from_pretrained(
            encoder, config=encoder_config, dtype=torch.float32, output_loading_info=True))
    with loading("the decoder", decoder):
        language_model = AutoModelForCausalLM.from_pretrained(decoder, config=decoder_config, dtype=torch.float32)
    if getattr(language_model.get_output_embeddings(), "bias", None) is not None:
        raise HfExtError(f"DECODER {decoder}: its LM head has a bias, which Optimus' LM head has not")
    pretrained_pooler = getattr(encoder_model, "pooler", None) is not None and not any(
        name.startswith("pooler.") for name in encoder_loading["missing_keys"])
    if encoder_pooling is None:
        encoder_pooling = _default_pooling(encoder, pretrained_pooler)
    elif encoder_pooling == "pooler" and not pretrained_pooler:
        raise HfExtError(f"ENCODER {encoder}: its checkpoint has no pretrained pooler: choose the 'cls' or 'mean' "
                         "encoder pooling")
    torch.manual_seed(seed)  # the new token embeddings and the latent projections
    if len(decoder_tokenizer) > language_model.config.vocab_size:
        language_model.resize_token_embeddings(len(decoder_tokenizer), mean_resizing=True)
    language_model.config.update(special_ids)

    config = OptimusConfig(encoder=encoder_model.config, decoder=language_model.config,
                           encoder_pooling=encoder_pooling, **optimus_settings)
    model = OptimusModel(config)
    with torch.no_grad():
        _copy_weights(model.encoder, encoder_model, "encoder", extra=("pooler.",))
        _copy_weights(model.decoder, language_model.base_model, "decoder")
        if not config.tie_word_embeddings:
            model.lm_head.weight.copy_(language_model.get_output_embeddings().weight)
    processor = OptimusProcessor(tokenizer=encoder_tokenizer, decoder_tokenizer=decoder_tokenizer)
    return model.eval(), processor


def _default_pooling(source: str, pretrained_pooler: bool) -> str:
    """The sentence feature `source`'s encoder was trained to give, logged with the reason."""
    sentence_pooling = sentence_transformers_pooling(source)
    if sentence_pooling is not None:
        choice, reason = sentence_pooling, "the pooling of the sentence-transformers model"
    elif pretrained_pooler:
        choice, reason = "pooler", "the encoder's pretrained pooler, as the original's BERT"
    else:
        choice, reason = "mean", "the encoder has no pretrained pooler"
    logger.info(f"encoder pooling: {choice} ({reason})")
    return choice


ADAPTER_SETTINGS = "optimus_backbones.json"
# the settings `optimus_from_backbones` takes that shape the model an adapter was trained on
REBUILD_SETTINGS = ("latent_size", "latent_as_gpt_memory", "latent_as_gpt_emb", "encoder_pooling", "beta", "fb_mode",
                    "dim_target_kl", "length_weighted_loss")


def _card_settings(config: OptimusConfig) -> dict[str, Any]:
    """What the Optimus card says of a model built from backbones, in its folder form and its adapter form alike."""
    from ... import __version__
    from .conversion import _injection_text

    return {"hf_ext_version": __version__, "latent_size": config.latent_size, "injection": _injection_text(config),
            "encoder_name": config.encoder.model_type, "decoder_name": config.decoder.model_type,
            "beta": config.beta, "dim_target_kl": config.dim_target_kl}


def save_backbones_adapter(model: "PeftModel", folder: str | Path, encoder: str, decoder: str) -> None:
    """Save what a LoRA run on an Optimus built by `optimus_from_backbones` trained (PEFT's adapter: the LoRA
    weights, the latent projections, the added tokens' embeddings) with the settings and the two backbones' names,
    so that `optimus_from_backbones_and_adapter` rebuilds the trained model from the public backbones: a few
    megabytes instead of the whole model."""
    from ...hub import card_data, write_model_card
    from . import ENTRY

    folder = Path(folder)
    model.save_pretrained(str(folder))
    config = cast(OptimusConfig, model.get_base_model().config)
    settings = {"encoder": encoder, "decoder": decoder, **{name: getattr(config, name) for name in REBUILD_SETTINGS}}
    (folder / ADAPTER_SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    # the model's card in its adapter form, over PEFT's empty template
    lora = cast("LoraConfig", model.peft_config[model.active_adapter])
    token_indices = lora.trainable_token_indices or []
    added = sorted({index for indices in token_indices.values() for index in indices}
                   if isinstance(token_indices, dict) else token_indices)
    # the card's base models: Hub ids, not local folders nor bare folder names
    hub_ids = [source for source in (encoder, decoder) if "/" in source and not Path(source).expanduser().exists()]
    write_model_card(
        folder, ENTRY.card_template,
        card_data(tags=["optimus", "vae", "lora", "peft"], base_model=hub_ids or None),
        model_name=folder.name, repo_id=str(folder), **_card_settings(config),
        adapter={"encoder": encoder, "decoder": decoder, "rank": lora.r,
                 "targets": [targets] if isinstance(targets := lora.target_modules, str) else sorted(targets or []),
                 "latent_modules": LATENT_MODULES, "added_token_ids": added, "pooling": config.encoder_pooling,
                 "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)},
    )


def optimus_from_backbones_and_adapter(adapter: str | Path, encoder: str | None = None, decoder: str | None = None,
                                       ) -> tuple[OptimusModel, OptimusProcessor]:
    """The Optimus model a LoRA run trained, rebuilt from its two backbones (the names `save_backbones_adapter`
    recorded, or `encoder` / `decoder`: other copies of the same models) and the `adapter` folder, the adapter
    merged into the weights."""
    from peft import PeftModel

    from ...trainer import quiet_peft

    with loading("the Optimus adapter", str(adapter)):
        settings = json.loads((Path(adapter) / ADAPTER_SETTINGS).read_text(encoding="utf-8"))
    model, processor = optimus_from_backbones(encoder or settings.pop("encoder"), decoder or settings.pop("decoder"),
                                              **{name: settings[name] for name in REBUILD_SETTINGS})
    with loading("the Optimus adapter", str(adapter)), quiet_peft():
        try:
            adapted = PeftModel.from_pretrained(model, str(adapter))
        except RuntimeError as error:  # torch's size mismatches: the adapter of other backbones
            raise HfExtError(f"the Optimus adapter {adapter} does not fit these backbones (trained on others?): "
                             f"{one_line(error)}") from None
    return cast(OptimusModel, adapted.merge_and_unload()).eval(), processor


def write_backbones_card(folder: str | Path, out: str | Path, model: OptimusModel, processor: OptimusProcessor,
                         encoder: str, decoder: str, adapter: str | None = None) -> None:
    """`folder/README.md` (the staging folder of the output `out`) for a model `optimus_from_backbones` built: the
    model card of Optimus folders, saying which backbones it was built from (Hub ids, or local folders by their
    names) and that its latent parts are untrained, or, built with the trained `adapter`
    (`optimus_from_backbones_and_adapter`), that they come from it."""
    from ...hub import card_data, model_name, write_model_card
    from . import ENTRY

    config = model.config
    decoder_tokenizer = processor.decoder_tokenizer
    hub_ids = [source for source in (encoder, decoder) if not Path(source).expanduser().exists()]
    write_model_card(
        folder, ENTRY.card_template,
        card_data(tags=["optimus", "vae", "text-generation"], pipeline_tag="text-generation",
                  base_model=hub_ids or None),
        model_name=Path(out).name, repo_id=Path(out).name, **_card_settings(config),
        encoder_layers=config.encoder.num_hidden_layers, encoder_hidden=config.encoder.hidden_size,
        decoder_layers=config.decoder.num_hidden_layers, decoder_hidden=config.decoder.hidden_size,
        decoder_vocab=config.decoder.vocab_size,
        special_tokens=[getattr(decoder_tokenizer, name) for name in ("pad_token", "bos_token", "eos_token")],
        backbones={"encoder": model_name(encoder), "decoder": model_name(decoder), "pooling": config.encoder_pooling,
                   "adapter": model_name(adapter) if adapter else None,
                   "latent_modules": LATENT_MODULES,
                   "added_tokens": decoder_tokenizer.convert_ids_to_tokens(added_decoder_token_ids(decoder_tokenizer))},
    )


__all__ = ["added_decoder_token_ids", "decoder_tokens_to_add", "optimus_from_backbones",
           "optimus_from_backbones_and_adapter", "save_backbones_adapter", "sentence_transformers_pooling",
           "write_backbones_card"]
