"""Configuration of the Universal Transformer (Dehghani et al., ICLR 2019) with Adaptive Computation Time."""

from transformers import PretrainedConfig

TRANSITIONS = ("fc", "sepconv", "conv")
STEP_SIGNALS = ("learned", "sinusoid", "none")
LAYER_NORM_TYPES = ("layer_norm", "unbiased_std")
HALTED_STATES = ("frozen", "transformed")
CLASSIFIER_POOLINGS = ("mean", "first")


class UniversalTransformerConfig(PretrainedConfig):
    r"""
    Configuration of a Universal Transformer: one shared layer applied recurrently over depth, with position and step
    signals added before every step and, optionally, Adaptive Computation Time (ACT) so that every position halts on
    its own. The defaults are tensor2tensor's `adaptive_universal_transformer_base` (`universal_transformer_base` with
    `recurrence_type="act"`); the PyTorch re-implementation (andreamad8/Universal-Transformer-Pytorch) is reached
    through `transition="conv"`, `layer_norm_type="unbiased_std"`, `step_signal="sinusoid"`,
    `final_layer_norm=False`, `scale_embeddings=False`, `project_embeddings=True`, `act_threshold=0.9` and
    `act_halted_state="transformed"`, which its converter sets.

    Args:
        vocab_size (`int`, defaults to 32768): vocabulary shared by the encoder, the decoder and the output softmax.
        hidden_size (`int`, defaults to 1024): width of the recurrent state.
        embedding_size (`int`, *optional*): width of the token embeddings; `hidden_size` when unset. A different
            width needs `project_embeddings`.
        project_embeddings (`bool`, defaults to `False`): a bias-free linear map from the embeddings to the state
            (after input dropout), as the PyTorch re-implementation has.
        scale_embeddings (`bool`, defaults to `True`): multiply looked-up embeddings by sqrt(embedding_size)
            (tensor2tensor's `multiply_embedding_mode="sqrt_depth"`). The input embedding module scales (and zeroes
            the padding id), so `get_input_embeddings()(input_ids)` is what the model reads; `inputs_embeds` are
            used as given.
        num_attention_heads (`int`, defaults to 16).
        attention_key_depth (`int`, *optional*): total query/key width over all heads; `hidden_size` when unset.
        attention_value_depth (`int`, *optional*): total value width over all heads; `hidden_size` when unset.
        intermediate_size (`int`, defaults to 4096): the transition function's inner width (t2t's `filter_size`).
        transition (`str`, defaults to `"fc"`): the transition function. `"fc"`: dense+ReLU -> dense (both biased);
            `"sepconv"`: depthwise-separable conv (kernel 3)+ReLU -> separable conv (kernel 5), as tensor2tensor;
            `"conv"`: conv (kernel 3)+ReLU -> conv (kernel 3)+ReLU, the PyTorch re-implementation's (its trailing ReLU
            included). Convolutions pad on both sides in the encoder and on the left in the decoder, and padding
            positions are zeroed before each convolution.
        num_steps (`int`, defaults to 6): recurrent steps without ACT (t2t's `num_rec_steps`).
        use_act (`bool`, defaults to `True`): Adaptive Computation Time on (encoder and decoder each halt per position).
        act_max_steps (`int`, defaults to 12): the most steps ACT takes (t2t: twice its `num_hidden_layers`, which
            is `num_steps` here). `num_hidden_layers` is the most steps the loop can take: this with ACT, `num_steps`
            without.
        act_threshold (`float`, defaults to 0.99): a position halts once its summed halting probability would exceed
            this value (t2t's `1 - act_epsilon`).
        act_loss_weight (`float`, defaults to 0.01): weight of the ponder cost mean(N + R) added to the training loss.
        act_halting_bias_init (`float`, defaults to 1.0): initial bias of the halting unit.
        act_halted_state (`str`, defaults to `"frozen"`): what a halted position does in later steps.
            `"frozen"` (the paper: "its state is simply copied to the next step"): its state stops changing and is
            only read, as key and value (from the copied state plus the step's signals) and, for convolutional
            transitions, as a neighbour; queries, attention output and transition run for running positions only.
            `"transformed"` (tensor2tensor's and the PyTorch re-implementation's code): every position is transformed
            at every step and halted positions keep feeding their newest state to the others; needed for parity with
            checkpoints of those codes, and as costly as fixed depth while any position runs.
        step_signal (`str`, defaults to `"learned"`): the step (depth) signal: a learned embedding per step (initialised
            N(0, 1/hidden_size), used times sqrt(hidden_size)), the sinusoid of the step index, or none.
        layer_norm_type (`str`, defaults to `"layer_norm"`): `"layer_norm"` is (x - mean) / sqrt(var + eps) with the
            biased variance (tensor2tensor); `"unbiased_std"` is (x - mean) / (std + eps) with the unbiased standard
            deviation (the PyTorch re-implementation).
        layer_norm_eps (`float`, defaults to 1e-6).
        final_layer_norm (`bool`, defaults to `True`): normalise the encoder's and decoder's outputs (tensor2tensor);
            the PyTorch re-implementation creates this norm but never applies it.
        hidden_dropout_prob (`float`, defaults to 0.3): dropout on each sublayer's output before the residual sum
            (t2t's `layer_prepostprocess_dropout`).
        input_dropout (`float`, defaults to 0.3): dropout on the input embeddings.
        attention_dropout (`float`, defaults to 0.1): dropout on the attention weights.
        relu_dropout (`float`, defaults to 0.1): dropout after the transition's ReLU.
        label_smoothing (`float`, defaults to 0.1): label smoothing of the sequence-to-sequence loss.
        classifier_pooling (`str`, defaults to `"mean"`): sequence feature of the classification head: the mean over
            non-padding positions, or the first position.
        classifier_dropout (`float`, *optional*): dropout before the classifier; `hidden_dropout_prob` when unset.
        initializer_gain (`float`, defaults to 1.0): weights start uniform in +-sqrt(3 gain / fan_in)
            (t2t's `uniform_unit_scaling`); embeddings start N(0, 1/hidden_size).
    """

    model_type = "universal-transformer"
    attribute_map = {"filter_size": "intermediate_size", "d_model": "hidden_size"}
    # Trainer's predictions are the logits; the ACT statistics stay available from the model's outputs
    keys_to_ignore_at_inference = [
        "ponder_cost", "n_updates", "remainders", "hidden_states", "attentions", "cross_attentions",
        "encoder_last_hidden_state",
        *(f"{side}_{name}" for side in ("encoder", "decoder")
          for name in ("ponder_cost", "n_updates", "remainders", "hidden_states", "attentions")),
    ]

    def __init__(
        self,
        vocab_size=32768,
        hidden_size=1024,
        embedding_size=None,
        project_embeddings=False,
        scale_embeddings=True,
        num_attention_heads=16,
        attention_key_depth=None,
        attention_value_depth=None,
        intermediate_size=4096,
        transition="fc",
        num_steps=6,
        use_act=True,
        act_max_steps=12,
        act_threshold=0.99,
        act_loss_weight=0.01,
        act_halting_bias_init=1.0,
        act_halted_state="frozen",
        step_signal="learned",
        layer_norm_type="layer_norm",
        layer_norm_eps=1e-6,
        final_layer_norm=True,
        hidden_dropout_prob=0.3,
        input_dropout=0.3,
        attention_dropout=0.1,
        relu_dropout=0.1,
        label_smoothing=0.1,
        classifier_pooling="mean",
        classifier_dropout=None,
        initializer_gain=1.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        tie_word_embeddings=True,
        is_encoder_decoder=True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.embedding_size = embedding_size if embedding_size is not None else hidden_size
        self.project_embeddings = bool(project_embeddings)
        self.scale_embeddings = bool(scale_embeddings)
        self.num_attention_heads = num_attention_heads
        self.attention_key_depth = attention_key_depth or hidden_size
        self.attention_value_depth = attention_value_depth or hidden_size
        self.intermediate_size = intermediate_size
        self.transition = transition
        self.num_steps = num_steps
        self.use_act = bool(use_act)
        self.act_max_steps = act_max_steps
        self.act_threshold = act_threshold
        self.act_loss_weight = act_loss_weight
        self.act_halting_bias_init = act_halting_bias_init
        self.act_halted_state = act_halted_state
        self.step_signal = step_signal
        self.layer_norm_type = layer_norm_type
        self.layer_norm_eps = layer_norm_eps
        self.final_layer_norm = bool(final_layer_norm)
        self.hidden_dropout_prob = hidden_dropout_prob
        self.input_dropout = input_dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.label_smoothing = label_smoothing
        self.classifier_pooling = classifier_pooling
        self.classifier_dropout = classifier_dropout
        self.initializer_gain = initializer_gain
        self.tie_word_embeddings = tie_word_embeddings
        # generation reads the start id from the config; it is also the id of the shifted-in first decoder input
        self.decoder_start_token_id = decoder_start_token_id
        # no decoding cache (as tensor2tensor): generate() re-runs the decoder over the whole prefix
        kwargs.setdefault("use_cache", False)
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, is_encoder_decoder=is_encoder_decoder,
                         **kwargs)
        self.validate_universal_transformer()

    @property
    def num_hidden_layers(self) -> int:
        """How many steps the loop can take: `act_max_steps` with ACT, `num_steps` without. As for transformers'
        layered models, `hidden_states` has `num_hidden_layers + 1` entries and `attentions` `num_hidden_layers`,
        whatever the input (with ACT, steps after a position halts repeat its state; see the model's outputs).
        Setting it sets `act_max_steps` with ACT, `num_steps` without."""
        return self.act_max_steps if self.use_act else self.num_steps

    @num_hidden_layers.setter
    def num_hidden_layers(self, value: int) -> None:
        setattr(self, "act_max_steps" if self.use_act else "num_steps", value)

    @property
    def num_step_signals(self) -> int:
        """How many step embeddings there are: one for every step the loop can take (`num_hidden_layers`)."""
        return self.num_hidden_layers

    def validate_universal_transformer(self) -> None:
        """Raise `ValueError` with one clear line for a configuration the model cannot run."""
        for name in ("vocab_size", "hidden_size", "embedding_size", "num_attention_heads", "attention_key_depth",
                     "attention_value_depth", "intermediate_size", "num_steps", "act_max_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("attention_key_depth", "attention_value_depth"):
            if getattr(self, name) % self.num_attention_heads:
                raise ValueError(f"{name} {getattr(self, name)} is not divisible by num_attention_heads "
                                 f"{self.num_attention_heads}")
        if not isinstance(self.act_threshold, (int, float)) or not 0 < self.act_threshold < 1:
            raise ValueError(f"act_threshold must lie strictly between 0 and 1, got {self.act_threshold!r}")
        if not isinstance(self.act_loss_weight, (int, float)) or self.act_loss_weight < 0:
            raise ValueError(f"act_loss_weight must be >= 0, got {self.act_loss_weight!r}")
        for name, value, allowed in (("transition", self.transition, TRANSITIONS),
                                     ("step_signal", self.step_signal, STEP_SIGNALS),
                                     ("layer_norm_type", self.layer_norm_type, LAYER_NORM_TYPES),
                                     ("act_halted_state", self.act_halted_state, HALTED_STATES),
                                     ("classifier_pooling", self.classifier_pooling, CLASSIFIER_POOLINGS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.embedding_size != self.hidden_size and not self.project_embeddings:
            raise ValueError(f"embedding_size {self.embedding_size} differs from hidden_size {self.hidden_size}: "
                             "set project_embeddings=True")
        for name in ("hidden_dropout_prob", "input_dropout", "attention_dropout", "relu_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
        if self.classifier_dropout is not None and not 0 <= self.classifier_dropout < 1:
            raise ValueError(f"classifier_dropout must lie in [0, 1), got {self.classifier_dropout!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")


__all__ = ["UniversalTransformerConfig"]
