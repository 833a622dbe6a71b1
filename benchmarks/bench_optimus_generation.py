#!/usr/bin/env python
"""Greedy decoding speed of `OptimusModel.generate` (KV cache, latent memory in slot 0).

(a) against the original's loop, reproduced on the same weights (`sample_sequence_conditional` in ChunyuanLI/Optimus):
    every step runs the model on the whole prefix without a cache, and only batch row 0 is decoded, so the original
    decodes a batch of latents one latent at a time;
(a') for comparison, not a target: a batched version of that loop, which the original does not have (all rows at
    every step, still without a cache);
(b) against `transformers.GPT2LMHeadModel.generate` holding the same decoder weights, on the same shapes.
Both loops must give the same greedy tokens as `generate`.
(c) a Llama-style decoder of GPT-2 small's size (768 wide, 12 layers, 12 heads with 4 key/value heads, MLP 2048,
    rotary positions, tied embeddings): `OptimusModel.generate` against `transformers.LlamaForCausalLM.generate`
    holding the same decoder weights, at batch 1 and at the batch of (b), with the same new tokens; measured, no
    target. `generate` must give the batched recompute loop's greedy tokens here too.

Only decoding is timed, so the encoder is tiny; the decoder of (a) and (b) is GPT-2 small (768 wide, 12 layers, 12
heads, vocabulary 50260).
"""

import statistics

import torch
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved
from transformers import BertConfig, GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hf_ext import OptimusConfig
from hf_ext.models.optimus.samples import random_model


def decoder_config(quick):
    vocab = 1003 if quick else 50260  # the last three ids are <PAD>, <BOS>, <EOS>, as in the original
    width, layers, heads = (64, 2, 2) if quick else (768, 12, 12)
    return GPT2Config(vocab_size=vocab, n_embd=width, n_layer=layers, n_head=heads, n_positions=1024,
                      pad_token_id=vocab - 3, bos_token_id=vocab - 2, eos_token_id=vocab - 1)


def llama_decoder_config(quick):
    """A Llama-style decoder of GPT-2 small's size: grouped-query attention (12 heads, 4 key/value heads), rotary
    positions, a gated MLP of 2048, RMSNorm, tied embeddings; the last three ids pad, BOS and EOS as for GPT-2."""
    vocab = 1003 if quick else 50260
    width, layers, heads, key_value_heads, mlp = (64, 2, 4, 2, 128) if quick else (768, 12, 12, 4, 2048)
    return LlamaConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=key_value_heads, intermediate_size=mlp, max_position_embeddings=1024,
                       tie_word_embeddings=True, pad_token_id=vocab - 3, bos_token_id=vocab - 2,
                       eos_token_id=vocab - 1)


def tiny_encoder():
    return BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=1, intermediate_size=64)


def build_models(quick, seed=0):
    """An OptimusModel with random weights and a GPT2LMHeadModel holding a copy of its decoder."""
    decoder = decoder_config(quick)
    optimus = random_model(OptimusConfig(encoder=tiny_encoder(), decoder=decoder, latent_size=32), seed=seed,
                           scale=0.02)
    gpt2 = GPT2LMHeadModel(GPT2Config(**decoder.to_dict())).eval()
    gpt2.transformer.load_state_dict(optimus.decoder.state_dict())
    assert gpt2.lm_head.weight.data_ptr() == gpt2.transformer.wte.weight.data_ptr(), "GPT-2 head is not tied"
    return optimus, gpt2


def build_llama_models(quick, seed=0):
    """An OptimusModel with a Llama-style decoder and a LlamaForCausalLM holding a copy of its decoder. The weights
    are the models' own random initialisation (RMSNorm weights at 1), which `random_model(scale=...)` would make
    noise around 0, as it does for all but GPT-2's LayerNorms."""
    decoder = llama_decoder_config(quick)
    optimus = random_model(OptimusConfig(encoder=tiny_encoder(), decoder=decoder, latent_size=32), seed=seed,
                           scale=None)
    llama = LlamaForCausalLM(LlamaConfig(**decoder.to_dict())).eval()
    llama.model.load_state_dict(optimus.decoder.state_dict())
    assert llama.lm_head.weight.data_ptr() == llama.model.embed_tokens.weight.data_ptr(), "Llama head is not tied"
    return optimus, llama


def greedy_config(model_config, new_tokens):
    # min_new_tokens bans <EOS>, so every call decodes exactly `new_tokens` tokens
    return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                            bos_token_id=model_config.bos_token_id, eos_token_id=model_config.eos_token_id,
                            pad_token_id=model_config.pad_token_id)


@torch.no_grad()
def recompute_greedy(model, latent_z, new_tokens):
    """Greedy decoding without a cache: the full prefix of every row through the model at every step; <EOS> banned
    as `min_new_tokens` does, so the tokens are comparable with `generate`."""
    dec = model.config.decoder
    generated = torch.full((latent_z.size(0), 1), dec.bos_token_id, dtype=torch.long)
    for _ in range(new_tokens):
        logits = model(decoder_input_ids=generated, latent_z=latent_z, use_cache=False).logits[:, -1]
        logits[:, dec.eos_token_id] = float("-inf")
        generated = torch.cat([generated, logits.argmax(-1, keepdim=True)], dim=1)
    return generated


def original_greedy(model, latent_z, new_tokens):
    """The original's loop reads the logits of batch row 0 only, so a batch of latents is decoded one at a time."""
    return torch.cat([recompute_greedy(model, z.unsqueeze(0), new_tokens) for z in latent_z])


def compare_tokens(cached, recomputed, name):
    """How many greedy tokens of `generate` (`cached`) a loop's equal, and the first new token where they differ."""
    agree = (cached == recomputed).all(dim=0).tolist()[1:]
    first_difference = agree.index(False) if False in agree else None
    counts = {"equal": int((cached == recomputed).sum()), "total": cached.numel(),
              "first_difference_at_new_token": first_difference}
    print(f"greedy tokens, generate vs {name}: {counts['equal']}/{cached.numel()} equal; "
          + ("identical sequences" if first_difference is None
             else f"first difference at new token {first_difference}"))
    return counts


def measure_llama(quick, batch, new_tokens, repeats):
    """(c): Optimus with the Llama-style decoder against LlamaForCausalLM.generate on the same weights, at batch 1
    and at `batch`. Returns the comparison of its greedy tokens with the batched recompute loop's (at `batch`)."""
    optimus, llama = build_llama_models(quick)
    dec = optimus.config.decoder
    parameters = sum(parameter.numel() for parameter in llama.parameters())
    print(f"Llama-style decoder: {dec.num_hidden_layers} layers, width {dec.hidden_size}, {dec.num_attention_heads} "
          f"heads ({dec.num_key_value_heads} key/value), MLP {dec.intermediate_size}, vocabulary {dec.vocab_size}, "
          f"{parameters / 1e6:.1f}M parameters")
    record("llama_decoder", {"layers": dec.num_hidden_layers, "width": dec.hidden_size,
                             "heads": dec.num_attention_heads, "key_value_heads": dec.num_key_value_heads,
                             "intermediate": dec.intermediate_size, "vocabulary": dec.vocab_size,
                             "parameters": parameters})
    latent_z = optimus.sample_prior(batch, torch.Generator().manual_seed(1))
    optimus_generation = greedy_config(optimus.config, new_tokens)
    llama_generation = greedy_config(dec, new_tokens)
    with torch.no_grad():
        cached = optimus.generate(latent_z=latent_z, generation_config=optimus_generation)
    equal_tokens = compare_tokens(cached, recompute_greedy(optimus, latent_z, new_tokens),
                                  "batched recompute loop (Llama-style)")
    record("llama_greedy_tokens_equal", equal_tokens)
    record("llama_distinct_tokens_generated", len(set(cached[:, 1:].flatten().tolist())))
    for rows in sorted({1, batch}):
        z = latent_z[:rows]
        bos = torch.full((rows, 1), dec.bos_token_id, dtype=torch.long)
        candidates = {
            "OptimusModel.generate (Llama-style)": torch.no_grad()(
                lambda z=z: optimus.generate(latent_z=z, generation_config=optimus_generation)),
            "LlamaForCausalLM.generate": torch.no_grad()(
                lambda bos=bos: llama.generate(bos, attention_mask=torch.ones_like(bos),
                                               generation_config=llama_generation)),
        }
        times = time_interleaved(candidates, repeats,
                                 section=f"Llama-style decoder: greedy decoding, batch {rows}, {new_tokens} new tokens")
        report_ratio(f"(c) Llama-style decoder, batch {rows}: time of OptimusModel.generate / "
                     f"LlamaForCausalLM.generate", times["OptimusModel.generate (Llama-style)"],
                     times["LlamaForCausalLM.generate"])
    return equal_tokens


def main(argv=None):
    parser = benchmark_parser(__doc__)
    parser.add_argument("--batch-size", type=int, help="sequences decoded together (default 8; quick 2)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per sequence (default 64; quick 8)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=3)
    batch = args.batch_size or (2 if args.quick else 8)
    new_tokens = args.new_tokens or (8 if args.quick else 64)
    torch.manual_seed(0)

    optimus, gpt2 = build_models(args.quick)
    dec = optimus.config.decoder
    print(f"decoder: {dec.n_layer} layers, width {dec.n_embd}, {dec.n_head} heads, vocabulary {dec.vocab_size}; "
          f"batch {batch}, {new_tokens} new tokens, greedy")
    record("decoder", {"layers": dec.n_layer, "width": dec.n_embd, "heads": dec.n_head, "vocabulary": dec.vocab_size})
    latent_z = optimus.sample_prior(batch, torch.Generator().manual_seed(1))
    optimus_generation = greedy_config(optimus.config, new_tokens)
    gpt2_generation = greedy_config(dec, new_tokens)
    bos = torch.full((batch, 1), dec.bos_token_id, dtype=torch.long)

    @torch.no_grad()
    def optimus_generate():
        return optimus.generate(latent_z=latent_z, generation_config=optimus_generation)

    @torch.no_grad()
    def gpt2_generate():
        return gpt2.generate(bos, attention_mask=torch.ones_like(bos), generation_config=gpt2_generation)

    cached = optimus_generate()
    loops = {"original loop (row by row)": original_greedy, "batched recompute loop": recompute_greedy}
    equal_tokens = {name: compare_tokens(cached, loop(optimus, latent_z, new_tokens), name)
                    for name, loop in loops.items()}
    record("greedy_tokens_equal", equal_tokens)
    distinct = len(set(cached[:, 1:].flatten().tolist()))
    print(f"{distinct} distinct tokens generated")
    record("distinct_tokens_generated", distinct)

    gpt2_generate()  # warm-up; the check above warmed up both Optimus paths
    tokens = batch * new_tokens
    # one round: both cached decoders and both slow loops, so every ratio compares runs made under the same load
    candidates = {"OptimusModel.generate": optimus_generate, "GPT2LMHeadModel.generate": gpt2_generate}
    candidates.update({name: (lambda loop=loop: loop(optimus, latent_z, new_tokens)) for name, loop in loops.items()})
    times = time_interleaved(candidates, repeats, warmup=0,
                             section=f"greedy decoding, batch {batch}, {new_tokens} new tokens")
    tokens_per_second = {name: tokens / statistics.median(seconds) for name, seconds in times.items()}
    for name, speed in tokens_per_second.items():
        print(f"  {name}: {speed:.1f} tokens/s")
    record("tokens_per_second_of_the_median_run", tokens_per_second)
    report_ratio("(a) speed-up of OptimusModel.generate over the original's loop", times["original loop (row by row)"],
                 times["OptimusModel.generate"], 10, higher_is_better=True)
    report_ratio("(a') for comparison: speed-up over the batched recompute loop", times["batched recompute loop"],
                 times["OptimusModel.generate"])
    report_ratio("(b) time of OptimusModel.generate / GPT2LMHeadModel.generate", times["OptimusModel.generate"],
                 times["GPT2LMHeadModel.generate"], 1.15)
    llama_tokens_equal = measure_llama(args.quick, batch, new_tokens, repeats)
    if any(counts["first_difference_at_new_token"] is not None
           for counts in [*equal_tokens.values(), llama_tokens_equal]):
        raise SystemExit("greedy tokens of generate and a recompute loop differ")
    finish()  # a run whose greedy tokens differ is a failure, not a result: it writes no results file


if __name__ == "__main__":
    main()
