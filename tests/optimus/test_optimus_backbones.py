"""Optimus on the backbones of issue #27, on tiny random configs: the encoders BERT, RoBERTa, DeBERTa-v2 and ModernBERT,
the decoders GPT-2, Llama, Qwen2, Qwen3, Mistral (a sliding window), Gemma and Gemma 2 (a sliding window and
soft-capping).

The decoder decides generation, so the generation checks (the cache against recomputation, sampling, beams, left
padding, the static cache), the latent memory's cache slot and save/reload run per decoder, each paired with one
encoder so that every encoder is built and saved too; the encoder checks (what the posterior reads, gradients) run per
encoder under a Llama decoder. The latent paths, the rotary positions around the memory and the sliding window are
checked on Llama, Qwen3, Mistral and Gemma 2. Llama (rotary, grouped-query attention) and Mistral (a sliding window)
are the fast tier; the other parametrisations, the Trainer, the latent space, the metrics, remote code and `hf-ext
serve` on Llama-decoder folders are slow."""

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, BertTokenizer, LlamaTokenizer, Qwen2Tokenizer
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext import OptimusConfig, OptimusLatentSpace, OptimusModel, OptimusProcessor
from hf_ext.models.optimus import ENTRY, kl_divergence
from hf_ext.models.optimus.configuration_optimus import decoder_head_dim, decoder_heads
from hf_ext.models.optimus.modeling_optimus import CACHE_NAME
from hf_ext.sample_text import bundled_sentences, train_bert_vocab, train_gpt2_bpe

V = 40  # the decoder vocabulary of the tiny configs; its last three ids are the pad, BOS and EOS tokens
PAD, BOS, EOS = V - 3, V - 2, V - 1
LATENT = 8
WINDOW = 4  # Mistral's and Gemma 2's sliding window: generations of 12 tokens cross it
STEPS = 12
TOLERANCE = 1e-5
# a left-padded batch runs its sums in another order than a row alone: float32 noise of about 1e-5 on these logits
# (in float64 the two agree exactly)
PADDING_TOLERANCE = 1e-4
TIE_MARGIN = 1e-4  # a greedy step whose best two logits are closer than this could go either way: no such step here
ENCODERS = ("bert", "roberta", "deberta-v2", "modernbert")
# each encoder's sentence feature: BERT's and RoBERTa's pooler; DeBERTa-v2 and ModernBERT have none
POOLING = {"bert": "pooler", "roberta": "pooler", "deberta-v2": "mean", "modernbert": "cls"}
# the encoder built beside each decoder in the decoder checks: every encoder appears
PAIRED_ENCODER = {"gpt2": "bert", "llama": "roberta", "qwen2": "deberta-v2", "qwen3": "modernbert", "mistral": "bert",
                  "gemma": "roberta", "gemma2": "modernbert"}
TIED = {"gpt2", "gemma", "gemma2"}  # the decoders that tie their LM head to the input embeddings by default
FAST = {"llama", "mistral"}
SLIDING = ("mistral", "gemma2")  # the decoders given a sliding window of WINDOW positions
SLOW = pytest.mark.slow


def tiered(values, fast):
    """pytest params of `values`, those not in `fast` marked slow."""
    return [value if value in fast else pytest.param(value, marks=SLOW) for value in values]


DECODER_PARAMS = tiered(PAIRED_ENCODER, FAST)


# ----- tiny configs and models ----------------------------------------------------------------------------------------

def encoder_config(kind):
    sizes = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, pad_token_id=0, initializer_range=0.5)
    if kind == "modernbert":  # no max_position_embeddings to set small; its special ids within the vocabulary
        sizes.update(global_attn_every_n_layers=1, local_attention=16, bos_token_id=1, eos_token_id=2,
                     cls_token_id=1, sep_token_id=2)
    else:
        sizes["max_position_embeddings"] = 64
    return AutoConfig.for_model(kind, **sizes)


def decoder_config(kind, **overrides):
    """A tiny decoder whose weights are drawn at a scale (initializer_range 0.5, Gemma 2 0.2) at which greedy decoding
    varies its tokens and no step is a near tie."""
    values = dict(vocab_size=V, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, initializer_range=0.5)
    if kind == "gpt2":
        values.update(n_embd=32, n_layer=2, n_head=4, n_positions=64)
    else:  # grouped-query attention: 4 heads share 2 key/value heads
        values.update(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    if kind in ("qwen3", "gemma", "gemma2"):  # a head size of their own, not hidden_size / heads
        values["head_dim"] = 16
    if kind in SLIDING:
        values["sliding_window"] = WINDOW
    if kind == "gemma2":  # soft-capping low enough to bite
        values.update(final_logit_softcapping=2.0, attn_logit_softcapping=5.0, initializer_range=0.2)
    values.update(overrides)
    return AutoConfig.for_model(kind, **values)


def build(decoder, encoder=None, seed=0, memory=True, embedding=True, **decoder_overrides):
    encoder = encoder or PAIRED_ENCODER[decoder]
    config = OptimusConfig(encoder=encoder_config(encoder), decoder=decoder_config(decoder, **decoder_overrides),
                           latent_size=LATENT, latent_as_gpt_memory=memory, latent_as_gpt_emb=embedding,
                           encoder_pooling=POOLING[encoder])
    torch.manual_seed(seed)
    return OptimusModel(config).eval()


@functools.cache
def shared(decoder):
    """The decoder's model for the checks that only read it."""
    return build(decoder)


def latents(rows, seed=1):
    return torch.randn(rows, LATENT, generator=torch.Generator().manual_seed(seed))


def tokens(rows, length, seed=2):
    """`rows` decoder inputs: BOS, then `length - 1` ordinary tokens."""
    body = torch.randint(0, PAD, (rows, length - 1), generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.full((rows, 1), BOS), body], dim=1)


def encoder_inputs(rows=3, length=7, seed=3):
    """Encoder ids with the rows after the first ending in padding (id 0, masked)."""
    input_ids = torch.randint(1, 50, (rows, length), generator=torch.Generator().manual_seed(seed))
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, rows):
        attention_mask[row, length - 2 * row:] = 0
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask


def generate(model, latent_z, input_ids=None, **kwargs):
    """generate() for `STEPS` new tokens (EOS held back), with its per-step logits."""
    input_ids = torch.full((latent_z.size(0), 1), BOS) if input_ids is None else input_ids
    settings = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, output_logits=True,
                    return_dict_in_generate=True)
    with torch.no_grad():
        return model.generate(latent_z=latent_z, input_ids=input_ids, **{**settings, **kwargs})


def assert_no_near_tie(step_logits):
    """The best two logits of every greedy step (EOS held back, as min_new_tokens does) differ by more than
    TIE_MARGIN, so that equal tokens are a real check and not the luck of a tie."""
    held = step_logits.clone()
    held[..., EOS] = -torch.inf
    best_two = held.topk(2, dim=-1).values
    margin = (best_two[..., 0] - best_two[..., 1]).min().item()
    assert margin > TIE_MARGIN, f"a near tie ({margin:.1e}): choose other seeds"


def new_tokens(sequences):
    return sequences[:, -STEPS:]


# ----- generation, per decoder ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("decoder", DECODER_PARAMS)
def test_greedy_generation_with_the_cache_is_recomputation(decoder):
    """Each step's logits from the cache equal a full forward over the generated prefix without a cache, and
    generate(use_cache=False) gives the same tokens and logits; 12 steps cross the sliding windows."""
    model = shared(decoder)
    latent = latents(3)
    cached = generate(model, latent)
    cached_logits = torch.stack(cached.logits, 1)
    with torch.no_grad():
        recomputed = model(decoder_input_ids=cached.sequences[:, :-1], latent_z=latent, use_cache=False).logits
    torch.testing.assert_close(cached_logits, recomputed, atol=TOLERANCE, rtol=TOLERANCE)
    assert_no_near_tie(recomputed)
    held = recomputed.clone()
    held[..., EOS] = -torch.inf
    assert torch.equal(new_tokens(cached.sequences), held.argmax(-1))
    uncached = generate(model, latent, use_cache=False)
    assert torch.equal(uncached.sequences, cached.sequences)
    torch.testing.assert_close(torch.stack(uncached.logits, 1), cached_logits, atol=TOLERANCE, rtol=TOLERANCE)
    assert len(new_tokens(cached.sequences).unique()) > 2  # not one token repeated


@pytest.mark.parametrize("decoder", DECODER_PARAMS)
def test_sampling_draws_the_same_tokens_with_and_without_the_cache(decoder):
    model = shared(decoder)
    latent = latents(3)
    torch.manual_seed(0)
    cached = generate(model, latent, do_sample=True)
    torch.manual_seed(0)
    uncached = generate(model, latent, do_sample=True, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(uncached.logits), torch.stack(cached.logits), atol=TOLERANCE,
                               rtol=TOLERANCE)
    assert not torch.equal(cached.sequences, generate(model, latent).sequences)  # it sampled


@pytest.mark.parametrize("decoder", DECODER_PARAMS)
def test_beam_search_is_the_same_with_and_without_the_cache(decoder):
    model = shared(decoder)
    latent = latents(2)
    settings = dict(num_beams=3, num_return_sequences=2, output_scores=True, output_logits=False)
    cached = generate(model, latent, **settings)
    uncached = generate(model, latent, use_cache=False, **settings)
    assert cached.sequences.shape == (4, 1 + STEPS)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=TOLERANCE, rtol=TOLERANCE)


def left_padded(prompts):
    """`prompts` (1-D token tensors) as one batch padded on the left, and its attention mask."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    return ids, mask


def assert_rows_continue_as_alone(model, prompts, steps):
    latent = latents(len(prompts))
    ids, mask = left_padded(prompts)
    batch = generate(model, latent, ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps)
    batch_logits = torch.stack(batch.logits, 1)
    assert_no_near_tie(batch_logits)
    for row, prompt in enumerate(prompts):
        alone = generate(model, latent[row:row + 1], prompt[None], max_new_tokens=steps, min_new_tokens=steps)
        assert torch.equal(batch.sequences[row, -steps:], alone.sequences[0, -steps:]), row
        torch.testing.assert_close(batch_logits[row], torch.stack(alone.logits, 1)[0], atol=PADDING_TOLERANCE,
                                   rtol=PADDING_TOLERANCE)


@pytest.mark.parametrize("decoder", tiered([d for d in PAIRED_ENCODER if d not in SLIDING], FAST))
def test_left_padded_batch_continues_each_row_as_alone(decoder):
    """Prompts of 1, 3 and 5 tokens, left-padded into one batch, continue as each prompt alone (token positions count
    real tokens only, after the memory's position 0)."""
    assert_rows_continue_as_alone(shared(decoder), [tokens(1, length, seed=length)[0] for length in (1, 3, 5)],
                                  STEPS)


@pytest.mark.parametrize("decoder", tiered(SLIDING, FAST))
def test_left_padding_is_refused_only_past_a_sliding_window(decoder):
    """Sliding layers measure distances in cache slots, and left padding sits between the memory (slot 0) and a padded
    row's tokens. Within the window (the memory, 2 slots of prompt, and 2 new tokens, the last one predicted at slot
    3) the rows continue as alone; one token more is refused with one line rather than let the memory leave the
    padded rows' windows early."""
    model = shared(decoder)
    prompts = [tokens(1, length, seed=length)[0] for length in (1, 2)]
    assert_rows_continue_as_alone(model, prompts, WINDOW - 2)
    ids, mask = left_padded(prompts)
    with pytest.raises(ValueError, match=f"^left padding past the decoder's sliding window of {WINDOW} positions: "):
        generate(model, latents(2), ids, attention_mask=mask, max_new_tokens=WINDOW - 1, min_new_tokens=WINDOW - 1)
    # the padding on the right of training labels is no left padding: the real positions read as without a mask
    labels = torch.tensor([[BOS, 3, 4, 5, 6, EOS, PAD], [BOS, 7, 8, 9, 10, 11, EOS]])
    with torch.no_grad():
        masked = model(labels=labels, latent_z=latents(2), decoder_attention_mask=(labels != PAD).long()).logits
        plain = model(labels=labels, latent_z=latents(2)).logits
    torch.testing.assert_close(masked[:, :-1], plain[:, :-1], atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("decoder", DECODER_PARAMS)
def test_static_cache_gives_the_dynamic_cache_output(decoder):
    model = shared(decoder)
    latent = latents(2)
    dynamic = generate(model, latent)
    static = generate(model, latent, cache_implementation="static")
    assert type(static[CACHE_NAME]).__name__ == "StaticCache"
    assert torch.equal(static.sequences, dynamic.sequences)
    torch.testing.assert_close(torch.stack(static.logits), torch.stack(dynamic.logits), atol=TOLERANCE,
                               rtol=TOLERANCE)


# ----- the latent memory in the cache, the decoder without a latent, save and reload ---------------------------------

@pytest.mark.parametrize("decoder", DECODER_PARAMS)
def test_the_memory_is_one_cache_slot_per_layer_and_key_value_head(decoder):
    """After a forward over 2 tokens every layer's cache holds 3 positions with num_key_value_heads heads of
    head_dim: slot 0 is the memory, its key and its value both the layer's chunk of latent_to_memory(z)."""
    model = shared(decoder)
    config = model.config.decoder
    _, key_value_heads = decoder_heads(config)
    head_dim = decoder_head_dim(config)
    latent = latents(2)
    with torch.no_grad():
        cache = model(decoder_input_ids=tokens(2, 2), latent_z=latent, use_cache=True)[CACHE_NAME]
        memory = model.latent_to_memory(latent).view(2, config.num_hidden_layers, key_value_heads, head_dim)
    assert cache.get_seq_length() == 3 and len(cache.layers) == config.num_hidden_layers
    for layer, cached in enumerate(cache.layers):
        assert cached.keys.shape == cached.values.shape == (2, key_value_heads, 3, head_dim)
        assert torch.equal(cached.keys[:, :, 0], memory[:, layer]) and torch.equal(cached.values[:, :, 0],
                                                                                     memory[:, layer])
    if decoder != "gpt2":
        assert key_value_heads == 2 < config.num_attention_heads  # grouped-query attention


@pytest.mark.parametrize("decoder", DECODER_PARAMS)
def test_without_a_latent_the_decoder_is_its_own_causal_lm(decoder):
    """With no latent, Optimus' decoder and LM head compute what transformers' causal LM of the decoder config does
    with the same weights: positions from 0, the head (tied or not), Gemma 2's final soft-capping."""
    model = shared(decoder)
    causal_lm = AutoModelForCausalLM.from_config(model.config.decoder).eval()
    causal_lm.base_model.load_state_dict(model.decoder.state_dict())
    with torch.no_grad():
        causal_lm.get_output_embeddings().weight.copy_(model.lm_head.weight)
        ids = tokens(2, 9)
        expected = causal_lm(input_ids=ids).logits
        logits = model(decoder_input_ids=ids).logits
    torch.testing.assert_close(logits, expected, atol=TOLERANCE, rtol=TOLERANCE)
    softcap = getattr(model.config.decoder, "final_logit_softcapping", None)
    if softcap is not None:
        assert logits.abs().max() < softcap and logits.abs().max() > 0.5 * softcap  # capped, and it bites


@pytest.mark.parametrize("decoder, head_settings", [
    ("cohere", {"logit_scale": 0.3}),  # logits times the scale
    ("granite", {"logits_scaling": 4.0, "embedding_multiplier": 2.0, "residual_multiplier": 0.5,
                 "attention_multiplier": 0.3}),  # logits divided by the scaling
])
def test_decoders_whose_head_rescales_the_logits_are_their_own_causal_lm(decoder, head_settings):
    model = build(decoder, encoder="bert", **head_settings)
    causal_lm = AutoModelForCausalLM.from_config(model.config.decoder).eval()
    causal_lm.base_model.load_state_dict(model.decoder.state_dict())
    with torch.no_grad():
        causal_lm.get_output_embeddings().weight.copy_(model.lm_head.weight)
        ids = tokens(2, 9)
        torch.testing.assert_close(model(decoder_input_ids=ids).logits, causal_lm(input_ids=ids).logits,
                                   atol=TOLERANCE, rtol=TOLERANCE)
    # and generation with the memory reads the cache as recomputation does
    latent_z = latents(2)
    cached = generate(model, latent_z)
    recomputed = generate(model, latent_z, use_cache=False)
    assert torch.equal(cached.sequences, recomputed.sequences)


def test_a_stray_key_value_head_count_in_a_gpt2_config_is_not_read():
    """GPT-2's attention has no grouped-query attention and ignores `num_key_value_heads` in its config.json: the
    memory must still fill every head."""
    config = decoder_config("gpt2")
    config.num_key_value_heads = 2
    assert decoder_heads(config) == (4, 4)
    model = build("gpt2", num_key_value_heads=2)
    latent_z = latents(2)
    assert torch.equal(generate(model, latent_z).sequences, generate(model, latent_z, use_cache=False).sequences)


@pytest.mark.parametrize("decoder, tie", [
    *[(decoder, None) if decoder in FAST else pytest.param(decoder, None, marks=SLOW) for decoder in PAIRED_ENCODER],
    ("llama", True),  # a Llama that ties, beside the default untied one
    pytest.param("gemma", False, marks=SLOW),  # a Gemma that does not
])
def test_save_and_reload_compute_bitwise_the_same(tmp_path, decoder, tie):
    """save_pretrained / AutoModel.from_pretrained: the same posterior, logits and generation to the bit; the LM head is
    tied to the input embeddings exactly when the decoder ties them, and only an untied head is stored."""
    overrides = {} if tie is None else {"tie_word_embeddings": tie}
    model = build(decoder, **overrides)
    tied = (decoder in TIED) if tie is None else tie
    assert model.config.tie_word_embeddings is tied
    input_ids, attention_mask = encoder_inputs()
    labels = tokens(3, 6)
    model.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(reloaded) is OptimusModel and reloaded.config.decoder.model_type == decoder
    with torch.no_grad():
        before = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        after = reloaded(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    for name in ("mean", "logvar", "logits", "loss"):
        assert torch.equal(before[name], after[name]), name
    assert torch.equal(generate(reloaded, before.mean).sequences, generate(model, before.mean).sequences)
    for loaded in (model, reloaded):
        assert (loaded.lm_head.weight is loaded.get_input_embeddings().weight) is tied
    with safe_open(tmp_path / "model.safetensors", "pt") as stored:
        assert ("lm_head.weight" in stored.keys()) is not tied
    if not tied:
        assert not torch.equal(reloaded.lm_head.weight, reloaded.get_input_embeddings().weight)


# ----- the latent's two paths -----------------------------------------------------------------------------------------

def z_effect(model, ids):
    """How far two latents move the logits of `ids` apart."""
    with torch.no_grad():
        first, second = (model(decoder_input_ids=ids, latent_z=latents(2, seed)).logits for seed in (1, 4))
    return (first - second).abs().max().item()


def with_zeroed(model, *projections):
    """A copy of `model` whose `projections` (latent projections by name) are zero."""
    copy = build(model.config.decoder.model_type, memory=model.config.latent_as_gpt_memory,
                 embedding=model.config.latent_as_gpt_emb)
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for projection in projections:
            getattr(copy, projection).weight.zero_()
    return copy


@pytest.mark.parametrize("decoder", tiered(["llama", "qwen3"], {"llama"}))
@pytest.mark.parametrize("memory, embedding", [(False, False), (True, False), (False, True), (True, True)])
def test_the_latent_acts_through_the_enabled_paths_only(decoder, memory, embedding):
    """z changes the logits exactly when a path is on, and only through the paths that are on: zeroing the projection
    of a disabled path changes nothing, zeroing every enabled one removes z's effect; the cache holds the memory
    slot exactly when the memory is on."""
    model = build(decoder, memory=memory, embedding=embedding)
    ids = tokens(2, 6)
    effect = z_effect(model, ids)
    assert (effect > 1e-2) if memory or embedding else effect == 0
    enabled = {"latent_to_memory": memory, "latent_to_embedding": embedding}
    with torch.no_grad():
        plain = model(decoder_input_ids=ids, latent_z=latents(2)).logits
    for projection, on in enabled.items():
        zeroed = with_zeroed(model, projection)
        with torch.no_grad():
            changed = (zeroed(decoder_input_ids=ids, latent_z=latents(2)).logits - plain).abs().max().item()
        assert (changed > 1e-2) if on else changed == 0, projection
        # what is left of z's effect: that of the other path, if it is on
        other_on = memory if projection == "latent_to_embedding" else embedding
        assert (z_effect(zeroed, ids) > 1e-2) if other_on else z_effect(zeroed, ids) == 0, projection
    assert z_effect(with_zeroed(model, *enabled), ids) == 0
    with torch.no_grad():
        cache = model(decoder_input_ids=ids, latent_z=latents(2), use_cache=True)[CACHE_NAME]
    assert cache.get_seq_length() == ids.size(1) + memory


# ----- rotary positions around the memory, the sliding window ---------------------------------------------------------

def one_layer_llama_by_hand(model, ids, latent, memory_position, first_token_position):
    """The logits of a one-layer Llama-decoder Optimus (both latent paths on) written out from its weights: the memory
    key rotated by `memory_position` (its value never is), the tokens' queries and keys by their positions from
    `first_token_position`; every token sees the memory and the tokens up to itself; 4 query heads share 2 key/value
    heads."""
    decoder, config = model.decoder, model.config.decoder
    layer, attention = decoder.layers[0], decoder.layers[0].self_attn
    heads, key_value_heads = decoder_heads(config)
    head_dim = decoder_head_dim(config)
    rows, length = ids.shape

    def heads_of(states, count):
        return states.view(rows, -1, count, head_dim).transpose(1, 2)

    hidden = decoder.embed_tokens(ids) + model.latent_to_embedding(latent)[:, None]
    normed = layer.input_layernorm(hidden)
    token_rotation = decoder.rotary_emb(normed, torch.arange(length)[None] + first_token_position)
    query, key = apply_rotary_pos_emb(heads_of(attention.q_proj(normed), heads),
                                      heads_of(attention.k_proj(normed), key_value_heads), *token_rotation)
    value = heads_of(attention.v_proj(normed), key_value_heads)
    memory = model.latent_to_memory(latent).view(rows, key_value_heads, 1, head_dim)
    memory_rotation = decoder.rotary_emb(normed, torch.tensor([[memory_position]]))
    memory_key = apply_rotary_pos_emb(memory, memory, *memory_rotation)[1]
    keys = torch.cat([memory_key, key], 2).repeat_interleave(heads // key_value_heads, 1)
    values = torch.cat([memory, value], 2).repeat_interleave(heads // key_value_heads, 1)
    scores = query @ keys.transpose(-1, -2) / head_dim**0.5
    visible = torch.ones(length, length + 1, dtype=torch.bool).tril(diagonal=1)  # column 0: the memory
    attended = scores.masked_fill(~visible, -torch.inf).softmax(-1) @ values
    hidden = hidden + attention.o_proj(attended.transpose(1, 2).reshape(rows, length, heads * head_dim))
    hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.lm_head(decoder.norm(hidden))


def test_rotary_positions_put_the_memory_at_0_unrotated_and_the_tokens_from_1():
    """The documented decision, against a hand computation of a one-layer Llama: memory at position 0, stored
    unrotated (rotary at 0 is the identity), tokens at 1..T, with and without a decoder attention mask. The two
    nearest other choices (the memory rotated as if at position 1; the tokens from 0) give other logits."""
    model = build("llama", num_hidden_layers=1)
    ids, latent = tokens(2, 7), latents(2)
    with torch.no_grad():
        logits = model(decoder_input_ids=ids, latent_z=latent).logits
        masked = model(decoder_input_ids=ids, latent_z=latent, decoder_attention_mask=torch.ones_like(ids)).logits
        by_hand = one_layer_llama_by_hand(model, ids, latent, memory_position=0, first_token_position=1)
        others = [one_layer_llama_by_hand(model, ids, latent, 1, 1), one_layer_llama_by_hand(model, ids, latent, 0, 0)]
    torch.testing.assert_close(logits, by_hand, atol=TOLERANCE, rtol=TOLERANCE)
    torch.testing.assert_close(masked, by_hand, atol=TOLERANCE, rtol=TOLERANCE)
    for other in others:
        assert (other - logits).abs().max() > 1e-2


@pytest.mark.parametrize("decoder", tiered(SLIDING, FAST))
def test_the_memory_leaves_the_sliding_window_as_position_0_does(decoder):
    """A window of 4 positions: the memory (position 0) is seen by the tokens at positions 1..3, the first three;
    from the fourth token on it is out of the window, and so are the first tokens: the logits then differ from the
    same weights without a window. Without the memory the tokens sit one position earlier and the first four agree.
    (Generating past the window with the cache equals recomputation: the generation checks above.)"""
    ids = tokens(2, 9)
    for memory, agreeing in ((True, WINDOW - 1), (False, WINDOW)):
        windowed = build(decoder, memory=memory)
        unwindowed = build(decoder, memory=memory, sliding_window=64)
        with torch.no_grad():
            difference = (windowed(decoder_input_ids=ids, latent_z=latents(2)).logits
                          - unwindowed(decoder_input_ids=ids, latent_z=latents(2)).logits).abs().amax((0, 2))
        assert (difference[:agreeing] < TOLERANCE).all() and (difference[agreeing:] > 1e-3).all(), difference


# ----- encoders -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoder", tiered(ENCODERS, {"bert", "modernbert"}))
def test_the_posterior_reads_each_sentence_s_own_tokens(encoder):
    """Under a Llama decoder: a padded row's posterior equals that of the row alone, unpadded (the pooling and the
    attention skip the padding), different sentences get different posteriors, and a training step reaches every
    encoder weight on the posterior's path."""
    model = build("llama", encoder=encoder)
    input_ids, attention_mask = encoder_inputs()
    with torch.no_grad():
        mean, logvar, outputs = model.encode(input_ids, attention_mask)
        assert mean.shape == logvar.shape == (3, LATENT)
        assert outputs.pooler_output.shape == (3, model.config.encoder.hidden_size)
        for row in range(1, 3):
            length = int(attention_mask[row].sum())
            alone, alone_logvar, _ = model.encode(input_ids[row:row + 1, :length])
            torch.testing.assert_close(alone, mean[row:row + 1], atol=TOLERANCE, rtol=TOLERANCE)
            torch.testing.assert_close(alone_logvar, logvar[row:row + 1], atol=TOLERANCE, rtol=TOLERANCE)
    assert (mean[0] - mean[1]).abs().max() > 1e-2
    assert (getattr(model.encoder, "pooler", None) is not None) is (POOLING[encoder] == "pooler")
    model.train()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=tokens(3, 6)).loss.backward()
    gradients = {name: parameter.grad for name, parameter in model.encoder.named_parameters()}
    assert all(gradient is not None and torch.isfinite(gradient).all() for gradient in gradients.values())
    for reached in (model.encoder.get_input_embeddings(), model.to_latent):
        assert reached.weight.grad.abs().sum() > 0


# ----- folders with tokenizers: Trainer, latent space, metrics, remote code, serve ------------------------------------

def texts():
    snli = Path(__file__).resolve().parent.parent / "data" / "snli_sentences" / "train.txt"
    return [line.strip() for line in snli.read_text(encoding="utf-8").splitlines() if line.strip()]


def llama_tokenizer(sentences, folder):
    """A SentencePiece-style BPE (the "▁" word marker) trained on `sentences`, as a `LlamaTokenizer` with its own
    <s> and </s> and an added <pad>: a decoder tokenizer whose special tokens are not GPT-2's."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                               special_tokens=["<unk>", "<s>", "</s>"]))
    folder.mkdir(parents=True, exist_ok=True)
    trained.model.save(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    merges = [tuple(line.split(" ")) for line in (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#")]
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges)
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    return tokenizer


def processor_for(decoder, folder):
    """An `OptimusProcessor` for a Llama decoder (a Llama tokenizer) or a Qwen2 one (a Qwen2 byte-level BPE with the
    original's added <PAD>, <BOS>, <EOS>), with a BERT WordPiece encoder tokenizer, all trained on the SNLI sample
    and the bundled sentences."""
    sentences = texts() + bundled_sentences()
    encoder_tokenizer = BertTokenizer(vocab=str(train_bert_vocab(sentences, folder / "encoder", vocab_size=250)))
    if decoder == "llama":
        decoder_tokenizer = llama_tokenizer(sentences, folder / "decoder")
    else:
        train_gpt2_bpe(sentences, folder / "decoder", vocab_size=300)
        decoder_tokenizer = Qwen2Tokenizer(vocab=str(folder / "decoder" / "vocab.json"),
                                           merges=str(folder / "decoder" / "merges.txt"))
        OptimusProcessor.add_decoder_special_tokens(decoder_tokenizer)
    return OptimusProcessor(tokenizer=encoder_tokenizer, decoder_tokenizer=decoder_tokenizer)


def model_for(processor, decoder, encoder="roberta", seed=0, initializer_range=0.02):
    """A small Optimus for `processor`'s vocabularies, initialised by transformers at `initializer_range` (at 0.02, a
    start that trains; at 0.5, one whose texts depend on the latent)."""
    tokenizer = processor.decoder_tokenizer
    config = OptimusConfig(
        encoder=AutoConfig.for_model(encoder, vocab_size=len(processor.tokenizer), hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64, pad_token_id=processor.tokenizer.pad_token_id,
                                     initializer_range=initializer_range),
        decoder=AutoConfig.for_model(decoder, vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                     max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     initializer_range=initializer_range),
        latent_size=LATENT, encoder_pooling=POOLING[encoder], beta=0.5)
    torch.manual_seed(seed)
    return OptimusModel(config).eval()


def reconstruction_loss_of(model, processor, sentences):
    """The mean summed token cross-entropy of reconstructing `sentences` from their posterior means."""
    model.eval()
    with torch.no_grad():
        return model(**processor(sentences)).loss_rec.mean().item()


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A RoBERTa-encoder, Llama-decoder Optimus with a Llama tokenizer, written as hf-ext writes a folder (the model
    code, every Auto class in `auto_map`, both tokenizers). Its random weights are large enough that the texts depend
    on the latent: a tiny model trained here learns the sample's sentences and ignores the latent."""
    from hf_ext.export import write_model_folder

    work = tmp_path_factory.mktemp("optimus_llama")
    processor = processor_for("llama", work / "tokenizers")
    model = model_for(processor, "llama", initializer_range=0.5)
    (work / "model").mkdir()
    write_model_folder(work / "model", OptimusModel, model.config, model.state_dict(), ENTRY.auto_map,
                       processor=processor)
    return work / "model"


@SLOW
@pytest.mark.parametrize("decoder", ["llama", "qwen2"])
def test_trainer_steps_lower_the_loss(tmp_path, decoder):
    """finetune_optimus (the Trainer, the beta schedule) for 60 steps on the SNLI sample: the reconstruction loss
    falls by more than a fifth, and so does the logged one."""
    from datasets import Dataset

    from hf_ext.models.optimus.training import finetune_optimus

    processor = processor_for(decoder, tmp_path / "tokenizers")
    model = model_for(processor, decoder)
    before = reconstruction_loss_of(model, processor, texts())
    trainer = finetune_optimus(model, processor, Dataset.from_dict({"text": texts()}), output_dir=tmp_path / "run",
                               max_steps=60, batch_size=8, learning_rate=1e-2, logging_steps=15, seed=0,
                               print_logs=False, use_cpu=True, report_to=[], disable_tqdm=True)
    after = reconstruction_loss_of(model, processor, texts())
    assert after < 0.8 * before, (before, after)
    logged = [entry["loss_rec"] for entry in trainer.state.log_history if "loss_rec" in entry]
    assert len(logged) == 4 and logged[-1] < 0.8 * logged[0]
    assert model.config.decoder.model_type == decoder


@SLOW
def test_latent_space_operations_and_metrics_on_a_llama_decoder(llama_folder):
    from hf_ext.models.optimus.metrics import evaluate_optimus_lm

    space = OptimusLatentSpace.from_pretrained(str(llama_folder), max_new_tokens=16)
    assert space.model.config.decoder.model_type == "llama"
    sentences = texts()[:4]
    reconstructions = space.reconstruct(sentences)
    assert len(reconstructions) == 4 and len(set(reconstructions)) > 1  # the latent decides the text
    path = space.interpolate(sentences[0], sentences[1], num_steps=4)
    assert [t for t, _ in path] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert path[0][1] == reconstructions[0] and path[-1][1] == reconstructions[1]
    assert space.interpolate_at(sentences[0], sentences[1], 1 / 3) == path[1][1]
    assert space.analogy(sentences[0], sentences[1], sentences[2], degree=0.0) == reconstructions[2]
    # a : a :: c : c
    assert space.analogy(sentences[0], sentences[0], sentences[3]) == reconstructions[3]
    samples = space.sample(3, generator=torch.Generator().manual_seed(0))
    assert len(set(samples)) > 1 and samples == space.sample(3, generator=torch.Generator().manual_seed(0))

    evaluated = texts()[:12]
    metrics = evaluate_optimus_lm(space.model, space.processor, evaluated, num_samples=10, samples_per_pass=5,
                                  generator=torch.Generator().manual_seed(0))
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values()), metrics
    mean, logvar = space.encode(evaluated)
    assert metrics["kl"] == pytest.approx(kl_divergence(mean, logvar).mean().item(), rel=1e-5) and metrics["kl"] > 0
    assert metrics["active_units"] == int((mean.var(0) >= 0.01).sum()) and 0 < metrics["active_units"] <= LATENT
    assert metrics["perplexity"] > 1 and metrics["reconstruction_nll"] > 0


@SLOW
def test_a_llama_decoder_folder_loads_as_remote_code_without_hf_ext(llama_folder, tmp_path):
    """In a process where hf_ext cannot be imported, the folder's own code loads the model, the classifier and the
    processor (a Llama decoder tokenizer): the same logits, posterior, generation and tokens as here."""
    from safetensors.torch import save_file
    from test_optimus_hub import Case, assert_matches_local, load_in_subprocess, subprocess_env

    folder = llama_folder
    sentences = texts()[:3]
    batch = OptimusProcessor.from_pretrained(folder)(sentences)
    save_file({"input_ids": batch["input_ids"], "labels": batch["labels"], "latent_z": latents(3)},
              tmp_path / "inputs.safetensors")
    case = Case(folder, tmp_path / "inputs.safetensors", sentences)
    env = subprocess_env(tmp_path / "home", HF_HUB_OFFLINE="1")
    jobs = [{"source": str(folder), "inputs": str(case.inputs_file), "texts": sentences, "card": False}]
    [(tensors, info)] = load_in_subprocess(tmp_path, jobs, env, isolate=True)
    assert_matches_local(tensors, info, case)
    assert info["hf_ext_modules"] == [] and all(module.startswith("transformers_modules.")
                                                for module in info["modules"])


@SLOW
def test_serve_reconstructs_through_the_api_on_a_llama_decoder(llama_folder):
    from conftest import local_client, running_app

    from hf_ext.models.optimus.app import MAX_NEW_TOKENS

    folder = llama_folder
    sentence = texts()[0]
    expected = OptimusLatentSpace.from_pretrained(str(folder), max_new_tokens=MAX_NEW_TOKENS).reconstruct([sentence])
    with running_app(folder) as url:
        answer = local_client(url).predict(sentence, "greedy", 4, 0.9, 0, api_name="/reconstruct")
    assert answer == expected[0] and answer

