"""Configuration of Optimus (Li et al., EMNLP 2020): encoder -> Gaussian latent -> causal decoder.

The paper's pair is BERT -> GPT-2; any bidirectional encoder transformers builds with `AutoModel` and any decoder-only
causal language model whose attention keeps a key/value `Cache` (GPT-2, Llama, Qwen2/3, Mistral, Gemma, ...) fit.
"""

import math
from typing import Any

from transformers import AutoConfig, BertConfig, GPT2Config, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

FB_MODES = (0, 1, 2)
ENCODER_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size")
DECODER_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "max_position_embeddings")
# the LayerNorm / RMSNorm epsilon under the names transformers' configs give it
EPSILONS = ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "norm_eps")
# the decoders' attention projections, LoRA's targets: GPT-2's Conv1D pair, and Llama's family's (Qwen, Mistral,
# Gemma, ...)
DECODER_ATTENTION = ("c_attn", "c_proj", "q_proj", "k_proj", "v_proj", "o_proj")
# attention layers whose cache holds keys and values, where the latent memory can sit
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
# encoders whose position ids start after the padding id (RoBERTa's family: padding_idx + 1)
OFFSET_POSITION_TYPES = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm",
                         "data2vec-text", "xmod")
CLASSIFIER_FEATURES = ("pooled", "latent_mean")
# the sentence feature the posterior reads: the encoder's own pooler (BERT's tanh(dense(h_CLS)), the original), the
# first token's hidden state, or the mean of the real tokens' hidden states (what sentence-transformers models learn)
ENCODER_POOLINGS = ("pooler", "cls", "mean")


class OptimusConfig(PretrainedConfig):
    r"""
    Configuration of an Optimus VAE.

    Args:
        encoder (`PretrainedConfig` or `dict`, *optional*): the encoder, any bidirectional encoder `AutoModel` builds
            (BERT, RoBERTa, DeBERTa-v2, ModernBERT, ...; a dict names it by `model_type`, BERT without one; BERT-base
            by default). Its `pad_token_id` (0 in the original) builds the encoder attention mask when none is given.
        decoder (`PretrainedConfig` or `dict`, *optional*): the decoder, any decoder-only causal language model whose
            attention layers keep a key/value cache (GPT-2, Llama, Qwen2/3, Mistral, Gemma, ...; a dict names it by
            `model_type`, GPT-2 without one), with its `vocab_size` covering the pad, BOS and EOS tokens whose ids
            are its `pad_token_id`, `bos_token_id` and `eos_token_id` (the original adds `<PAD>`, `<BOS>`, `<EOS>`
            to GPT-2). GPT-2-base with those three tokens by default.
        latent_size (`int`, defaults to 32): size of the latent code z.
        latent_as_gpt_memory (`bool`, defaults to `True`): z enters every decoder layer as one extra key/value slot
            (one per key/value head) at position 0; the tokens' positions then start at 1, as in the original.
        latent_as_gpt_emb (`bool`, defaults to `True`): z is projected and added to every token embedding.
        encoder_pooling (`str`, defaults to `"pooler"`): the sentence feature the posterior reads: `"pooler"` (the
            encoder's pooled output, as the original's BERT), `"cls"` (the first token's hidden state) or `"mean"`
            (the mean over the real tokens, what sentence-transformers encoders are trained for).
        beta (`float`, defaults to 1.0): weight of the KL term (the schedule's maximum during training).
        fb_mode (`int`, defaults to 1): KL thresholding ("free bits") mode of the original: 0 plain KL, 1 per-dimension
            hard threshold at `dim_target_kl` (dims at or below it contribute nothing), 2 deterministic connection
            (logvar fixed to 0). As in the original training loop, mode 1 falls back to plain KL while beta is 0.
        dim_target_kl (`float`, defaults to 3.0): per-dimension KL threshold of `fb_mode=1`.
        length_weighted_loss (`bool`, defaults to `False`): divide each sentence's reconstruction loss by its number of
            non-pad tokens (BOS and EOS included) before adding the KL term.
        classifier_feature (`str`, defaults to `"pooled"`): feature `OptimusForSequenceClassification` reads:
            `"pooled"` (the encoder's pooled output, what the original GLUE fine-tuning uses) or `"latent_mean"`.
        freeze_encoder (`bool`, defaults to `False`): train only the classifier (the original's `--use_freeze`).
        classifier_dropout (`float`, *optional*): dropout before the classifier; when unset, the encoder's own
            classifier or hidden dropout (`classifier_dropout`, `hidden_dropout_prob`, `hidden_dropout`, `dropout`:
            the first its config has), else none.
        tie_word_embeddings (`bool`, *optional*): tie the LM head to the decoder's input embeddings; the decoder's
            own setting when unset (GPT-2 ties them, as the original).
    """

    model_type = "optimus"
    sub_configs = {"encoder": AutoConfig, "decoder": AutoConfig}
    # the decoder cache is `cache` from transformers 5.24 on, `past_key_values` before
    keys_to_ignore_at_inference = ["cache", "past_key_values", "encoder_last_hidden_state", "encoder_pooler_output"]

    def __init__(
        self,
        encoder: PretrainedConfig | dict[str, Any] | None = None,
        decoder: PretrainedConfig | dict[str, Any] | None = None,
        latent_size: int = 32,
        latent_as_gpt_memory: bool = True,
        latent_as_gpt_emb: bool = True,
        encoder_pooling: str = "pooler",
        beta: float = 1.0,
        fb_mode: int = 1,
        dim_target_kl: float = 3.0,
        length_weighted_loss: bool = False,
        classifier_feature: str = "pooled",
        freeze_encoder: bool = False,
        classifier_dropout: float | None = None,
        tie_word_embeddings: bool | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(encoder, dict):
            encoder = sub_config_from_dict(encoder, "encoder", "bert")
        if isinstance(decoder, dict):
            decoder = sub_config_from_dict(decoder, "decoder", "gpt2")
        self.encoder = encoder if encoder is not None else BertConfig()
        if decoder is None:
            # GPT-2 with the original's three added tokens <PAD>, <BOS>, <EOS> after <|endoftext|>.
            decoder = GPT2Config(vocab_size=50260, pad_token_id=50257, bos_token_id=50258, eos_token_id=50259)
        self.decoder = decoder
        self.latent_size = latent_size
        self.latent_as_gpt_memory = bool(latent_as_gpt_memory)
        self.latent_as_gpt_emb = bool(latent_as_gpt_emb)
        self.encoder_pooling = encoder_pooling
        self.beta = beta
        self.fb_mode = fb_mode
        self.dim_target_kl = dim_target_kl
        self.length_weighted_loss = bool(length_weighted_loss)
        self.classifier_feature = classifier_feature
        self.freeze_encoder = bool(freeze_encoder)
        self.classifier_dropout = classifier_dropout
        self.tie_word_embeddings = (getattr(self.decoder, "tie_word_embeddings", True) if tie_word_embeddings is None
                                    else tie_word_embeddings)
        # generate() reads the special ids from the top-level config
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            kwargs.setdefault(name, getattr(self.decoder, name, None))
        super().__init__(**kwargs)
        self.validate_optimus()

    @property
    def max_encoder_tokens(self) -> int | None:
        """The most tokens the encoder reads: its positions, less RoBERTa's family's offset (None: no limit)."""
        positions = getattr(self.encoder, "max_position_embeddings", None)
        if positions is not None and self.encoder.model_type in OFFSET_POSITION_TYPES:
            return positions - (self.encoder.pad_token_id or 0) - 1
        return positions

    @property
    def max_decoder_tokens(self) -> int:
        """The most tokens the decoder reads: its positions, less the latent memory's position 0."""
        return self.decoder.max_position_embeddings - int(self.latent_as_gpt_memory)

    def validate_optimus(self) -> None:
        """Raise `ValueError` with one clear line for a configuration the model cannot run."""
        if not isinstance(self.latent_size, int) or self.latent_size <= 0:
            raise ValueError(f"latent_size must be a positive integer, got {self.latent_size!r}")
        if self.fb_mode not in FB_MODES:
            raise ValueError(f"fb_mode must be one of {FB_MODES}, got {self.fb_mode!r}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        if self.dim_target_kl < 0:
            raise ValueError(f"dim_target_kl must be >= 0, got {self.dim_target_kl!r}")
        if self.classifier_feature not in CLASSIFIER_FEATURES:
            raise ValueError(f"classifier_feature must be one of {CLASSIFIER_FEATURES}, "
                             f"got {self.classifier_feature!r}")
        if self.encoder_pooling not in ENCODER_POOLINGS:
            raise ValueError(f"encoder_pooling must be one of {ENCODER_POOLINGS}, got {self.encoder_pooling!r}")
        check_encoder(self.encoder)
        check_decoder(self.decoder)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            token_id = getattr(self.decoder, name, None)
            if token_id is not None and not 0 <= token_id < self.decoder.vocab_size:
                raise ValueError(f"decoder {name} {token_id} is outside the vocabulary of {self.decoder.vocab_size}")


def sub_config_from_dict(values: dict[str, Any], side: str, default_type: str) -> PretrainedConfig:
    """A side's config from its dict: `model_type` picks the class (the original's pair, BERT and GPT-2, for folders
    written before other backbones were possible, whose dicts may lack it)."""
    values = dict(values)
    model_type = values.pop("model_type", default_type)
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"{side} model_type {model_type!r} is not a model type transformers knows")
    return CONFIG_MAPPING[model_type](**values)


def check_encoder(config: PretrainedConfig) -> None:
    """`ValueError` with one line unless `config` is a bidirectional encoder with sane sizes: a model type with a
    masked-LM head (what sets BERT's family apart from causal language models), not an encoder-decoder, not set up
    as a decoder."""
    if not isinstance(config, PretrainedConfig):
        raise ValueError(f"the encoder must be a transformers config, got {type(config).__name__}")
    if (getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False)
            or config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES):
        raise ValueError(f"the encoder must be a bidirectional encoder (BERT, RoBERTa, DeBERTa, ModernBERT, ...), but "
                         f"{config.model_type!r} is not one (a decoder given as the encoder?)")
    # DeBERTa-v2 has no segment embeddings: type_vocab_size 0
    sizes = [name for name in ENCODER_SIZES if getattr(config, name, None) is not None
             and not (name == "type_vocab_size" and config.type_vocab_size == 0)]
    _check_sizes(config, "encoder", sizes, "hidden_size", "num_attention_heads", _epsilon_name(config))


def check_decoder(config: PretrainedConfig) -> None:
    """`ValueError` with one line unless `config` is a decoder-only causal LM whose every layer is attention with a
    key/value cache (where the latent memory goes), with sane sizes."""
    if not isinstance(config, PretrainedConfig):
        raise ValueError(f"the decoder must be a transformers config, got {type(config).__name__}")
    if (config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES or getattr(config, "is_encoder_decoder", False)
            or config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        raise ValueError(f"the decoder must be a decoder-only causal language model (GPT-2, Llama, Qwen, Mistral, "
                         f"Gemma, ...), but {config.model_type!r} is not one (an encoder given as the decoder?)")
    layer_types = getattr(config, "layer_types", None) or ()
    other = sorted(set(layer_types) - set(ATTENTION_LAYER_TYPES))
    if other or getattr(config, "num_attention_heads", None) is None:
        raise ValueError(f"the decoder {config.model_type!r} keeps no key/value cache in every layer "
                         f"({', '.join(other) or 'no attention heads'}), where Optimus puts the latent memory")
    # named as the config names them (GPT-2: n_embd, n_layer, n_head, n_positions)
    own = config.attribute_map
    sizes = [own.get(name, name) for name in DECODER_SIZES if getattr(config, name, None) is not None]
    # a decoder with its own head size (Gemma, Qwen3) need not split its width into the heads
    width = "hidden_size" if getattr(config, "head_dim", None) is None else "num_attention_heads"
    _check_sizes(config, "decoder", sizes, own.get(width, width), own.get("num_attention_heads", "num_attention_heads"),
                 _epsilon_name(config))
    heads, key_value_heads = decoder_heads(config)
    if heads % key_value_heads:
        raise ValueError(f"decoder num_attention_heads {heads} is not divisible by num_key_value_heads "
                         f"{key_value_heads}")


def decoder_heads(config: PretrainedConfig) -> tuple[int, int]:
    """The decoder's attention heads and key/value heads (fewer with grouped-query attention). Key/value heads are
    read only from a config class that has them: a stray `num_key_value_heads` in a GPT-2 config.json, which GPT-2's
    attention ignores, must not size the memory."""
    heads = config.num_attention_heads
    key_value_heads = getattr(config, "num_key_value_heads", None) if hasattr(type(config), "num_key_value_heads") \
        else None
    return heads, key_value_heads or heads


def decoder_head_dim(config: PretrainedConfig) -> int:
    """The size of one decoder attention head: the config's own `head_dim`, or the width split into the heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _epsilon_name(config: PretrainedConfig) -> str | None:
    return next((name for name in EPSILONS if getattr(config, name, None) is not None), None)


def _check_sizes(config, side, sizes, width, heads, epsilon):
    """Sizes must be positive integers (not strings or booleans, which a hand-edited config.json may hold), the
    width must split into the heads, and the LayerNorm epsilon must be a positive finite number."""
    for name in sizes:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{side} {name} must be a positive integer, got {value!r}")
    if getattr(config, width) % getattr(config, heads):
        raise ValueError(f"{side} {width} {getattr(config, width)} is not divisible by {heads} "
                         f"{getattr(config, heads)}")
    if epsilon is None:
        return
    value = getattr(config, epsilon)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{side} {epsilon} must be a positive finite number, got {value!r}")


__all__ = ["OptimusConfig"]
