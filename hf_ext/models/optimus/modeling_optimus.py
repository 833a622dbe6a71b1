"""Optimus (Li et al., EMNLP 2020): an encoder, a Gaussian latent z and a causal decoder that reads z.

The paper's pair is BERT -> GPT-2; the encoder is any bidirectional `AutoModel` encoder and the decoder any decoder-only
causal LM whose attention layers keep a key/value `Cache`. z reaches the decoder in two ways, each switchable in the
config, exactly as in the original code:
- memory: `latent_to_memory(z)` is cut into one chunk per layer (`num_key_value_heads * head_dim` wide, GPT-2's
  `n_embd`), split into the key/value heads and prepended to that layer's keys *and* values (no projection, no norm,
  no bias). It lives in slot 0 of a pre-filled KV cache, so token positions start at 1 and the decoder's causal mask
  lets every token see it. Rotary decoders store keys rotated by their position; the memory's position is 0, whose
  rotation is the identity, so the memory key is stored as it is and each token sees it at its own distance (rotary
  attention depends on distances only, so starting the tokens at 1 changes nothing among them). In a sliding-window
  layer the memory is the token at position 0: it leaves the window as that token would (sliding layers count cache
  slots, which left padding puts between the memory and a row's tokens: left-padded rows are refused once the
  sequence outgrows the window);
- embedding: `latent_to_embedding(z)` is added to every token embedding.
"""

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoModel, GPT2Model, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPooling, SequenceClassifierOutput
from transformers.models.auto.modeling_auto import MODEL_MAPPING
from transformers.utils import ModelOutput, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_optimus import OptimusConfig, decoder_head_dim, decoder_heads

# transformers 5.24 renamed the decoder cache `past_key_values` -> `cache` in forwards, outputs and generation. The
# name the installed version uses is decided once, here, from GPT-2's own signature.
CACHE_NAME = "cache" if "cache" in inspect.signature(GPT2Model.forward).parameters else "past_key_values"
# `forward(cache=...)` also takes `past_key_values=` as transformers' own models do: with their deprecation warning
# where the old name is deprecated (5.24+), silently before (a deprecation "version" already reached is not shown).
accept_past_key_values = deprecate_kwarg(
    "past_key_values", "5.40.0" if CACHE_NAME == "cache" else "0", new_name="cache"
)


@dataclass
class OptimusOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`): the training objective, batch mean of
        `loss_rec / sent_length + beta * loss_kl` (or `loss_rec + beta * loss_kl` without length weighting).
    loss_rec (`torch.FloatTensor` of shape `(batch_size,)`): summed token cross-entropy of each example (pads ignored,
        BOS never predicted), as the original computes it.
    loss_kl (`torch.FloatTensor` of shape `(batch_size,)`): KL term of each example under the config's `fb_mode`.
    logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, vocab_size)`): decoder LM logits.
    latent_z (`torch.FloatTensor` of shape `(batch_size, latent_size)`): the latent the decoder read.
    mean, logvar (`torch.FloatTensor` of shape `(batch_size, latent_size)`): the Gaussian posterior.
    cache (`Cache`): decoder cache whose slot 0 holds the latent memory (`past_key_values` before transformers 5.24).
    hidden_states, attentions: the decoder's (the language model's), with `output_hidden_states` /
        `output_attentions`; the attention keys start with the latent memory slot when there is one.
    encoder_last_hidden_state, encoder_pooler_output, encoder_hidden_states, encoder_attentions: the encoder's
        (`encoder_pooler_output` is the sentence feature the posterior reads, after `config.encoder_pooling`).
    """

    loss: torch.Tensor | None = None
    loss_rec: torch.Tensor | None = None
    loss_kl: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    latent_z: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    logvar: torch.Tensor | None = None
    if CACHE_NAME == "cache":
        cache: Cache | None = None
    else:
        past_key_values: Cache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    encoder_last_hidden_state: torch.Tensor | None = None
    encoder_pooler_output: torch.Tensor | None = None
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_attentions: tuple[torch.Tensor, ...] | None = None


def standard_normal(shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None,
                    device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """N(0, I) draws of `shape` on `device` in `dtype`, drawn in at least float32 where `generator` lives (on `device`
    without one) and then moved: a seeded CPU generator gives the same draws, rounded to `dtype`, for a model on any
    device and in any dtype."""
    drawn = torch.randn(shape, generator=generator, device=generator.device if generator is not None else device,
                        dtype=torch.promote_types(dtype, torch.float32))
    return drawn.to(device=device, dtype=dtype)


def kl_per_dimension(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, exp(logvar)) || N(0, I)) of each latent dimension."""
    return 0.5 * (mean.pow(2) + logvar.exp() - logvar - 1)


def kl_divergence(mean: torch.Tensor, logvar: torch.Tensor, fb_mode: int = 0, dim_target_kl: float = 0.0,
                  ) -> torch.Tensor:
    """Per-example KL under the original's free-bits modes (see `OptimusConfig.fb_mode`)."""
    if fb_mode == 2:
        return kl_per_dimension(mean, torch.zeros_like(logvar)).sum(-1)
    kl = kl_per_dimension(mean, logvar)
    if fb_mode == 1:
        kl = kl * (kl > dim_target_kl).to(kl.dtype)
    return kl.sum(-1)


def reconstruction_loss(logits: torch.Tensor, labels: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """Summed next-token cross-entropy of each sequence; `labels` are also the decoder input (BOS is never a target)."""
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    token_loss = F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1), ignore_index=pad_token_id,
        reduction="none",
    )
    return token_loss.view(shift_labels.shape).sum(-1)


def no_split_modules_outside_input_embeddings(model: PreTrainedModel) -> set[str]:
    """`model._no_split_modules` (its backbones', which `post_init` collects) less the classes of the modules that hold
    its input embeddings, such as BERT's `BertEmbeddings` or RoBERTa's `RobertaEmbeddings`. accelerate's FSDP2 plan
    (`fsdp2_prepare_model`) makes each no-split module an FSDP unit, then the input embeddings a unit of their own:
    inside a no-split unit they would be sharded a second time, which FSDP2 cannot do."""
    embeddings = model.get_input_embeddings()
    path = next(name for name, module in model.named_modules() if module is embeddings).split(".")
    holders = {type(model.get_submodule(".".join(path[:depth]))).__name__ for depth in range(1, len(path))}
    return set(model._no_split_modules or ()) - holders


class OptimusPreTrainedModel(PreTrainedModel):
    config: OptimusConfig
    base_model_prefix = "optimus"
    main_input_name = "input_ids"
    # The decoder's memory lives in the KV cache, which gradient checkpointing drops in training.
    supports_gradient_checkpointing = False
    # the original's pair; an instance lists its own backbones' (post_init)
    _no_split_modules: set[str] | list[str] | None = ["BertLayer", "GPT2Block"]
    _supports_sdpa = True
    _supports_attention_backend = True
    # Trainer: the loss is a batch mean, not normalised across gradient-accumulation steps.
    accepts_loss_kwargs = False

    def post_init(self) -> None:
        super().post_init()
        # the backbones' no-split modules, which super().post_init() collects, less those that hold the input embeddings
        self._no_split_modules = no_split_modules_outside_input_embeddings(self)

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=self.config.decoder.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)

    def _encoder_attention_mask(self, input_ids, attention_mask):
        if attention_mask is not None:
            return attention_mask
        # The original builds the mask as (input_ids > 0): BERT's pad id.
        return (input_ids != self.config.encoder.pad_token_id).long()

    def _build_encoder(self) -> None:
        """The encoder (`AutoModel` for `config.encoder`), with its pooling layer where the sentence feature is the
        pooler's; what it reads is decided once here from its forward's signature."""
        config = self.config
        parameters = inspect.signature(MODEL_MAPPING[type(config.encoder)].__init__).parameters  # type: ignore[misc]
        pooling = config.encoder_pooling == "pooler"
        self.encoder = AutoModel.from_config(
            config.encoder, **({"add_pooling_layer": pooling} if "add_pooling_layer" in parameters else {}))
        if pooling and getattr(self.encoder, "pooler", None) is None:
            raise ValueError(f"the {config.encoder.model_type} encoder has no pooler: set encoder_pooling to 'cls' "
                             f"or 'mean'")
        self.encoder_reads_segments = "token_type_ids" in inspect.signature(self.encoder.forward).parameters
        self._no_split_modules = list(self.encoder._no_split_modules or [])

    def _encode(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs) -> BaseModelOutputWithPooling:
        """The encoder's output, its `pooler_output` the sentence feature of `config.encoder_pooling`."""
        attention_mask = self._encoder_attention_mask(input_ids, attention_mask)
        if token_type_ids is not None and self.encoder_reads_segments:
            kwargs["token_type_ids"] = token_type_ids
        outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
        hidden = outputs.last_hidden_state
        pooling = self.config.encoder_pooling
        if pooling == "pooler":
            feature = outputs.pooler_output
        elif pooling == "cls":
            feature = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            feature = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=feature,
                                          hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    def _output_flags(self, output_attentions, output_hidden_states):
        """The output switches for the sub-models, which read their own configs: a keyword wins over this model's
        config."""
        return {
            "output_attentions": self.config.output_attentions if output_attentions is None else output_attentions,
            "output_hidden_states": (self.config.output_hidden_states if output_hidden_states is None
                                     else output_hidden_states),
        }


class OptimusModel(OptimusPreTrainedModel, GenerationMixin):
    """The Optimus VAE: encoder, posterior, decoder with latent injection, LM head tied to the decoder embeddings.

    `forward` takes the encoder side as `input_ids`/`attention_mask` and the decoder side as `labels` (BOS ... EOS,
    right-padded with the decoder pad id, used both as decoder input and as targets, as the original does) or as
    `decoder_input_ids`. `generate(latent_z=z, ...)` decodes from BOS with a KV cache.
    """

    _tied_weights_keys = {"lm_head.weight": "decoder.wte.weight"}  # GPT-2's; an instance names its decoder's

    def __init__(self, config: OptimusConfig):
        super().__init__(config)
        enc, dec = config.encoder, config.decoder
        self._build_encoder()
        self.to_latent = nn.Linear(enc.hidden_size, 2 * config.latent_size, bias=False)
        # the decoder's base model (GPT2Model, LlamaModel, ...); the LM head is this model's, as in the original
        self.decoder = AutoModel.from_config(dec)
        self._no_split_modules = [*(self._no_split_modules or []), *(self.decoder._no_split_modules or [])]
        embedding_name = next(name for name, module in self.decoder.named_modules()
                              if module is self.decoder.get_input_embeddings())
        self._tied_weights_keys = {"lm_head.weight": f"decoder.{embedding_name}.weight"}
        _, key_value_heads = decoder_heads(dec)
        memory_width = key_value_heads * decoder_head_dim(dec)  # one key (= value) per key/value head
        # Both projections always exist (the original saves both); the config switches decide which are used.
        self.latent_to_memory = nn.Linear(config.latent_size, dec.num_hidden_layers * memory_width, bias=False)
        self.latent_to_embedding = nn.Linear(config.latent_size, dec.hidden_size, bias=False)
        self.lm_head = nn.Linear(dec.hidden_size, dec.vocab_size, bias=False)
        self.beta = config.beta  # current KL weight; schedules update it during training
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.decoder.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.decoder.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        self.lm_head = new_embeddings

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.save_pretrained`, and where the config names Optimus' pipelines in `custom_pipelines` (a
        model loaded from a folder hf-ext wrote), the pipelines' code beside the model's, so that the new folder
        runs them as remote code too."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if getattr(self.config, "custom_pipelines", None):
            from transformers.dynamic_module_utils import custom_object_save

            from .pipeline_optimus import OptimusTextGenerationPipeline

            custom_object_save(OptimusTextGenerationPipeline, str(save_directory))  # the file holds both pipelines

    # ----- latent space -------------------------------------------------------------------------------------------

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, **kwargs: Any,
               ) -> tuple[torch.Tensor, torch.Tensor, BaseModelOutputWithPooling]:
        """Posterior of each input: `(mean, logvar, encoder_outputs)`."""
        encoder_outputs = self._encode(input_ids, attention_mask, token_type_ids, **kwargs)
        mean, logvar = self.to_latent(encoder_outputs.pooler_output).chunk(2, -1)
        return mean, logvar, encoder_outputs

    @staticmethod
    def reparameterize(mean: torch.Tensor, logvar: torch.Tensor, generator: torch.Generator | None = None,
                       ) -> torch.Tensor:
        """z = mean + eps * exp(logvar / 2), eps ~ N(0, I) (drawn as `standard_normal` draws)."""
        eps = standard_normal(mean.shape, generator, mean.device, mean.dtype)
        return mean + eps * torch.exp(0.5 * logvar)

    def sample_prior(self, num_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """`num_samples` latents from the N(0, I) prior, on the model's device and in its dtype (drawn as
        `standard_normal` draws: a seeded CPU generator gives the same latents on every device)."""
        return standard_normal((num_samples, self.config.latent_size), generator, self.device, self.dtype)

    @staticmethod
    def interpolate(z_start: torch.Tensor, z_end: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Latents on the line from `z_start` to `z_end`: `(1 - t) z_start + t z_end` for t = 0 ... 1 (`num_steps`)."""
        if num_steps < 2:
            raise ValueError(f"num_steps must be at least 2, got {num_steps}")
        t = torch.linspace(0, 1, num_steps, device=z_start.device, dtype=z_start.dtype).unsqueeze(-1)
        return (1 - t) * z_start.reshape(1, -1) + t * z_end.reshape(1, -1)

    @staticmethod
    def analogy(z_a: torch.Tensor, z_b: torch.Tensor, z_c: torch.Tensor, degree: float = 1.0) -> torch.Tensor:
        """a : b :: c : ? in latent space, as the original: `z_c + (z_b - z_a) * degree`."""
        return z_c + (z_b - z_a) * degree

    def memory_cache(self, latent_z: torch.Tensor, cache: Cache | None = None) -> Cache:
        """Put the latent memory into slot 0 of every decoder layer of `cache` (a new `DynamicCache` by default)."""
        dec = self.config.decoder
        _, key_value_heads = decoder_heads(dec)
        memory = self.latent_to_memory(latent_z).view(latent_z.size(0), dec.num_hidden_layers, key_value_heads, 1,
                                                      decoder_head_dim(dec))
        cache = cache if cache is not None else DynamicCache(config=dec)
        for layer in range(dec.num_hidden_layers):
            # the same tensor is the key and the value, as in the original
            cache.update(memory[:, layer], memory[:, layer], layer)
        return cache

    # ----- forward --------------------------------------------------------------------------------------------------

    @can_return_tuple
    @accept_past_key_values
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        latent_z: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> OptimusOutput:
        r"""
        input_ids, attention_mask, token_type_ids: the encoder side (the encoder tokenizer's ids; `token_type_ids`
            reach encoders with segment embeddings only). Without a mask, ids equal to the
            encoder pad id are masked, as the original's `(input_ids > 0)`.
        decoder_input_ids: decoder tokens; defaults to `labels`, as in the original.
        decoder_attention_mask: optional decoder padding mask over the tokens (the memory slot is added here).
        labels: decoder targets (BOS ... EOS, right-padded with the decoder pad id).
        latent_z: use this latent instead of encoding `input_ids` (training samples the posterior, eval uses its mean).
        cache: the decoder's `Cache` (slot 0: the latent memory, filled from `latent_z` when empty); also accepted as
            `past_key_values`.
        logits_to_keep: logits for the last `logits_to_keep` decoder positions only (0: all; a tensor: those
            positions), as transformers' LM heads; `generate()` passes 1. The loss needs all of them.
        """
        config = self.config
        output_flags = self._output_flags(output_attentions, output_hidden_states)
        mean = logvar = encoder_outputs = None
        if input_ids is not None:
            mean, logvar, encoder_outputs = self.encode(input_ids, attention_mask, token_type_ids, **output_flags)
            if config.fb_mode == 2:  # deterministic connection: the posterior variance is fixed to 1
                logvar = torch.zeros_like(logvar)
            if latent_z is None:
                latent_z = self.reparameterize(mean, logvar) if self.training else mean

        if decoder_input_ids is None:
            decoder_input_ids = labels
        if use_cache is None:
            use_cache = getattr(config.decoder, "use_cache", True)
        logits = None
        decoder_outputs = None
        if decoder_input_ids is not None:
            decoder_outputs = self._decode(
                decoder_input_ids, latent_z, decoder_attention_mask, decoder_position_ids, cache, use_cache,
                **output_flags, **kwargs,
            )
            if labels is not None and not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
                raise ValueError("labels need the logits of every position: leave logits_to_keep at 0")
            kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            logits = self.lm_head(decoder_outputs.last_hidden_state[:, kept])
            # what the decoder's own causal-LM head does after its projection: Cohere's logit_scale (a factor),
            # Granite's logits_scaling (a divisor), Gemma 2's final soft-capping
            logit_scale = getattr(config.decoder, "logit_scale", None)
            if logit_scale is not None:
                logits = logits * logit_scale
            logits_scaling = getattr(config.decoder, "logits_scaling", None)
            if logits_scaling is not None:
                logits = logits / logits_scaling
            softcap = getattr(config.decoder, "final_logit_softcapping", None)
            if softcap is not None:
                logits = torch.tanh(logits / softcap) * softcap

        loss = loss_rec = loss_kl = None
        if mean is not None:
            assert logvar is not None  # encoded with the mean
            # the original switches to plain KL while the schedule holds beta at 0
            fb_mode = 0 if (config.fb_mode == 1 and self.beta == 0) else config.fb_mode
            loss_kl = kl_divergence(mean, logvar, fb_mode, config.dim_target_kl)
        if labels is not None:
            assert logits is not None  # the decoder input defaults to the labels
            pad_token_id = config.decoder.pad_token_id
            if pad_token_id is None:
                raise ValueError("labels are padded with the decoder's pad_token_id, which its config does not set")
            loss_rec = reconstruction_loss(logits, labels, pad_token_id)
            per_example = loss_rec
            if config.length_weighted_loss:
                per_example = loss_rec / (labels != pad_token_id).sum(-1).to(loss_rec.dtype)
            if loss_kl is not None:
                per_example = per_example + self.beta * loss_kl
            loss = per_example.mean()

        # the memory cache is this model's own, and some decoders (Llama, Gemma 2) return it whatever use_cache says:
        # returned without use_cache, generate() would hand it back and the next step would read its tokens twice
        decoder_cache = getattr(decoder_outputs, CACHE_NAME) if decoder_outputs is not None and use_cache else None
        return OptimusOutput(
            loss=loss,
            loss_rec=loss_rec,
            loss_kl=loss_kl,
            logits=logits,
            latent_z=latent_z,
            mean=mean,
            logvar=logvar,
            **{CACHE_NAME: decoder_cache},
            hidden_states=decoder_outputs.hidden_states if decoder_outputs is not None else None,
            attentions=decoder_outputs.attentions if decoder_outputs is not None else None,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state if encoder_outputs is not None else None,
            encoder_pooler_output=encoder_outputs.pooler_output if encoder_outputs is not None else None,
            encoder_hidden_states=encoder_outputs.hidden_states if encoder_outputs is not None else None,
            encoder_attentions=encoder_outputs.attentions if encoder_outputs is not None else None,
        )

    def _decode(self, input_ids, latent_z, attention_mask, position_ids, cache, use_cache, **kwargs):
        config = self.config
        batch_size = input_ids.size(0)
        inputs_embeds = self.decoder.get_input_embeddings()(input_ids)
        with_memory = latent_z is not None and config.latent_as_gpt_memory
        if latent_z is not None:
            if latent_z.size(0) != batch_size:
                raise ValueError(f"latent_z has {latent_z.size(0)} rows but the decoder input has {batch_size}")
            # a latent made elsewhere (float32 draws, another device) is read in the decoder's dtype and place
            latent_z = latent_z.to(inputs_embeds.device, inputs_embeds.dtype)
            if config.latent_as_gpt_emb:
                inputs_embeds = inputs_embeds + self.latent_to_embedding(latent_z).unsqueeze(1)
            if with_memory and (cache is None or cache.get_seq_length() == 0):
                cache = self.memory_cache(latent_z, cache)
        if attention_mask is not None:
            if with_memory:
                attention_mask = torch.cat([attention_mask.new_ones(batch_size, 1), attention_mask], dim=1)
                self._check_left_padding_within_the_window(attention_mask)
            if position_ids is None:
                # count real tokens only, so left padding does not shift positions; the memory slot takes position 0
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -input_ids.size(1):]
        return self.decoder(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **{CACHE_NAME: cache},
            return_dict=True,
            **kwargs,
        )

    def _check_left_padding_within_the_window(self, attention_mask: torch.Tensor) -> None:
        """`ValueError` for left-padded rows (the memory's mask column first) once the sequence outgrows a sliding
        window: sliding layers count distances by cache index, and the padding sits between the memory (index 0) and
        a padded row's tokens, so the memory would leave that row's window before it leaves the row's window alone."""
        dec = self.config.decoder
        window = getattr(dec, "sliding_window", None)
        layer_types = getattr(dec, "layer_types", None)
        if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
            return
        if attention_mask.size(1) > window and bool((attention_mask[:, 1] == 0).any()):
            raise ValueError(f"left padding past the decoder's sliding window of {window} positions: the latent "
                             f"memory would leave a padded row's window early; decode rows of different lengths "
                             f"apart, without padding")

    def _memory_slots(self) -> int:
        """How many positions of the decoder's cache the latent memory takes before the tokens (0 or 1)."""
        return 1 if self.config.latent_as_gpt_memory else 0

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, next_sequence_length: int | None = None,
                                      attention_mask: torch.Tensor | None = None, **kwargs: Any) -> dict[str, Any]:
        # generate() grows the decoder sequence under the name `input_ids`; the encoder side is not used here. The
        # cache travels in `kwargs` under the installed version's name (CACHE_NAME).
        kwargs.pop("position_ids", None)  # positions come from the mask and the memory slot in `_decode`
        cache = kwargs.get(CACHE_NAME)
        if next_sequence_length is not None and cache is not None and kwargs.get("latent_z") is not None:
            cached = int(cache.get_seq_length())
            if cached:
                # generate() is handed the whole sequence and counts as new what the cache does not hold, from the
                # cache's length: that length includes the memory slot, which is no token. Counted so, a prefill
                # that continues from a cache (generate() given an earlier call's cache and output) would read one
                # token too few, none at all when one is new (a slice [-0:] takes the whole sequence again).
                next_sequence_length = input_ids.size(1) - (cached - self._memory_slots())
        model_inputs = super().prepare_inputs_for_generation(
            input_ids, next_sequence_length=next_sequence_length, attention_mask=attention_mask, **kwargs,
        )
        model_inputs.pop("position_ids", None)
        if CACHE_NAME in model_inputs:
            model_inputs["cache"] = model_inputs.pop(CACHE_NAME)
        model_inputs["decoder_input_ids"] = model_inputs.pop("input_ids")
        if "attention_mask" in model_inputs:
            model_inputs["decoder_attention_mask"] = model_inputs.pop("attention_mask")
        return model_inputs

    def create_masks_for_generate(self, attention_mask: torch.Tensor | None = None, **kwargs: Any,
                                  ) -> torch.Tensor | None:
        """The mask generate() passes with a static (compilable) cache: the 2D token mask as it is. transformers would
        build the 4D mask here from the token mask and the cache, which holds the memory slot that the token mask
        does not cover; `_decode` adds the slot's column and GPT-2 builds the 4D mask from it and the cache."""
        return attention_mask

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size,
                                      max_cache_length):
        # a cache of a fixed size (static) holds the memory slot as well as the tokens
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, batch_size,
                                                     max_cache_length + self._memory_slots())

    def _validate_model_kwargs(self, model_kwargs):
        if model_kwargs.get("latent_z") is None:
            raise ValueError("Optimus generate() needs latent_z (for text, encode it first: model.encode(...))")
        # forward also takes the cache as `past_key_values` (`accept_past_key_values`), which its signature does not
        # show; generate() before transformers 5.24 passes it so to an assistant model
        super()._validate_model_kwargs({name: value for name, value in model_kwargs.items()
                                        if name != "past_key_values"})


def classifier_dropout(config: OptimusConfig) -> float:
    """The dropout before `OptimusForSequenceClassification`'s classifier: `config.classifier_dropout`, else the
    encoder's own classifier dropout or hidden dropout under the name its family uses (BERT's `hidden_dropout_prob`,
    ModernBERT's `classifier_dropout`, ...), else none."""
    candidates = (config.classifier_dropout, *(getattr(config.encoder, name, None) for name in
                                               ("classifier_dropout", "hidden_dropout_prob", "hidden_dropout",
                                                "dropout")))
    return next((float(value) for value in candidates if value is not None), 0.0)


class OptimusForSequenceClassification(OptimusPreTrainedModel):
    """Classifier on the Optimus encoder's features, as the original's GLUE fine-tuning (`run_glue_vae.py`).

    The feature is the encoder's pooled output by default (`config.classifier_feature`), or the posterior mean.
    With `config.freeze_encoder` only the classifier learns. The weights load from an `OptimusModel` checkpoint.
    The loss is transformers' for `config.problem_type` (single-label, multi-label or regression; inferred from
    `num_labels` and the labels when unset).
    """

    def __init__(self, config: OptimusConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._build_encoder()
        self.to_latent = nn.Linear(config.encoder.hidden_size, 2 * config.latent_size, bias=False)
        self.dropout = nn.Dropout(classifier_dropout(config))
        feature_size = config.encoder.hidden_size if config.classifier_feature == "pooled" else config.latent_size
        assert config.num_labels is not None  # PretrainedConfig sets it (2 unless given)
        self.classifier = nn.Linear(feature_size, config.num_labels)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.encoder.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.encoder.set_input_embeddings(value)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        # transformers records the new size in the config's text config, for Optimus the decoder's (the generating
        # side); this model's embeddings are the encoder's
        decoder_vocab_size = self.config.decoder.vocab_size
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.config.decoder.vocab_size = decoder_vocab_size
        self.config.encoder.vocab_size = embeddings.weight.shape[0]
        return embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        kwargs.pop("num_items_in_batch", None)
        encoder_outputs = self._encode(input_ids, attention_mask, token_type_ids,
                                       **self._output_flags(output_attentions, output_hidden_states))
        feature = encoder_outputs.pooler_output
        assert feature is not None  # `_encode` always sets the sentence feature
        if self.config.classifier_feature == "latent_mean":
            feature = self.to_latent(feature).chunk(2, -1)[0]
        if self.config.freeze_encoder:
            feature = feature.detach()
        logits = self.classifier(self.dropout(feature))

        loss = None
        if labels is not None:
            # transformers' own choice of loss by `config.problem_type` (inferred from num_labels and the labels'
            # dtype when unset): cross-entropy, binary cross-entropy per label, or mean squared error
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=encoder_outputs.hidden_states,
                                        attentions=encoder_outputs.attentions)


__all__ = ["OptimusOutput", "OptimusPreTrainedModel", "OptimusModel", "OptimusForSequenceClassification",
           "kl_divergence", "kl_per_dimension", "reconstruction_loss"]
