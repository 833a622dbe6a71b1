"""Configuration of Optimus (Li et al., EMNLP 2020): BERT encoder -> Gaussian latent -> GPT-2 decoder."""

import math
from typing import Any

from transformers import BertConfig, GPT2Config, PretrainedConfig

FB_MODES = (0, 1, 2)
ENCODER_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size")
DECODER_SIZES = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")
CLASSIFIER_FEATURES = ("pooled", "latent_mean")


class OptimusConfig(PretrainedConfig):
    r"""
    Configuration of an Optimus VAE.

    Args:
        encoder (`BertConfig` or `dict`, *optional*): the BERT encoder. Its `pad_token_id` (0 in the original)
            builds the encoder attention mask when none is given.
        decoder (`GPT2Config` or `dict`, *optional*): the GPT-2 decoder, with its `vocab_size` already resized
            for the added `<PAD>`, `<BOS>`, `<EOS>` tokens, whose ids are its `pad_token_id`, `bos_token_id` and
            `eos_token_id`.
        latent_size (`int`, defaults to 32): size of the latent code z.
        latent_as_gpt_memory (`bool`, defaults to `True`): z enters every decoder layer as one extra key/value slot;
            the tokens' position ids then start at 1, as in the original.
        latent_as_gpt_emb (`bool`, defaults to `True`): z is projected and added to every token embedding.
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
        classifier_dropout (`float`, *optional*): dropout before the classifier; the encoder's `hidden_dropout_prob`
            when unset.
    """

    model_type = "optimus"
    sub_configs = {"encoder": BertConfig, "decoder": GPT2Config}
    # the decoder cache is `cache` from transformers 5.24 on, `past_key_values` before
    keys_to_ignore_at_inference = ["cache", "past_key_values", "encoder_last_hidden_state", "encoder_pooler_output"]

    def __init__(
        self,
        encoder: BertConfig | dict[str, Any] | None = None,
        decoder: GPT2Config | dict[str, Any] | None = None,
        latent_size: int = 32,
        latent_as_gpt_memory: bool = True,
        latent_as_gpt_emb: bool = True,
        beta: float = 1.0,
        fb_mode: int = 1,
        dim_target_kl: float = 3.0,
        length_weighted_loss: bool = False,
        classifier_feature: str = "pooled",
        freeze_encoder: bool = False,
        classifier_dropout: float | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        if isinstance(encoder, dict):
            encoder = BertConfig(**{k: v for k, v in encoder.items() if k != "model_type"})
        if isinstance(decoder, dict):
            decoder = GPT2Config(**{k: v for k, v in decoder.items() if k != "model_type"})
        self.encoder = encoder if encoder is not None else BertConfig()
        if decoder is None:
            # GPT-2 with the original's three added tokens <PAD>, <BOS>, <EOS> after <|endoftext|>.
            decoder = GPT2Config(vocab_size=50260, pad_token_id=50257, bos_token_id=50258, eos_token_id=50259)
        self.decoder = decoder
        self.latent_size = latent_size
        self.latent_as_gpt_memory = bool(latent_as_gpt_memory)
        self.latent_as_gpt_emb = bool(latent_as_gpt_emb)
        self.beta = beta
        self.fb_mode = fb_mode
        self.dim_target_kl = dim_target_kl
        self.length_weighted_loss = bool(length_weighted_loss)
        self.classifier_feature = classifier_feature
        self.freeze_encoder = bool(freeze_encoder)
        self.classifier_dropout = classifier_dropout
        self.tie_word_embeddings = tie_word_embeddings
        # generate() reads the special ids from the top-level config
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            kwargs.setdefault(name, getattr(self.decoder, name, None))
        super().__init__(**kwargs)
        self.validate_optimus()

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
        _check_sizes(self.encoder, "encoder", ENCODER_SIZES, "hidden_size", "num_attention_heads", "layer_norm_eps")
        _check_sizes(self.decoder, "decoder", DECODER_SIZES, "n_embd", "n_head", "layer_norm_epsilon")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            token_id = getattr(self.decoder, name, None)
            if token_id is not None and not 0 <= token_id < self.decoder.vocab_size:
                raise ValueError(f"decoder {name} {token_id} is outside the vocabulary of {self.decoder.vocab_size}")


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
    value = getattr(config, epsilon)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{side} {epsilon} must be a positive finite number, got {value!r}")


__all__ = ["OptimusConfig"]
