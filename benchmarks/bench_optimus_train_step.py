#!/usr/bin/env python
"""One training step (forward + backward) of `OptimusModel` against a plain `BertModel` + `GPT2LMHeadModel` of the
same sizes (BERT-base and GPT-2 small, batch 8 x 32 tokens), both in training mode with dropout.

The baseline's loss is the GPT-2 LM loss plus the mean of BERT's pooled output, so its backward pass runs through
both networks as Optimus' does; what remains is Optimus' own overhead: the latent projection, sampling, the latent
memory in the KV cache, the embedding injection and the KL term.
"""

import copy

import torch
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved
from transformers import BertModel, GPT2LMHeadModel

from hf_ext import OptimusConfig, OptimusModel
from hf_ext.models.optimus.samples import tiny_config


def build_config(quick):
    """BERT-base + GPT-2 small with the three added decoder tokens (OptimusConfig's defaults), or tiny sizes."""
    if quick:
        return tiny_config(encoder_vocab_size=200, decoder_base_vocab_size=300, latent_size=16)
    return OptimusConfig(latent_size=32)


def batch_of(config, batch_size, length, generator):
    enc, dec = config.encoder, config.decoder
    input_ids = torch.randint(1, enc.vocab_size, (batch_size, length), generator=generator)
    # BOS ... EOS with no padding, so both models predict the same number of tokens
    labels = torch.randint(0, dec.vocab_size - 3, (batch_size, length), generator=generator)
    labels[:, 0], labels[:, -1] = dec.bos_token_id, dec.eos_token_id
    return input_ids, labels


def main(argv=None):
    parser = benchmark_parser(__doc__)
    parser.add_argument("--batch-size", type=int, default=8, help="examples per step (default 8)")
    parser.add_argument("--length", type=int, default=32, help="tokens per example on each side (default 32)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=7, quick_repeats=2)
    torch.manual_seed(0)

    config = build_config(args.quick)
    optimus = OptimusModel(config).train()
    # fresh config copies: the first model to be built writes its attention implementation into the config
    bert = BertModel(copy.deepcopy(config.encoder)).train()
    gpt2 = GPT2LMHeadModel(copy.deepcopy(config.decoder)).train()
    input_ids, labels = batch_of(config, args.batch_size, args.length, torch.Generator().manual_seed(0))
    optimus_parameters = sum(p.numel() for p in optimus.parameters())
    plain_parameters = sum(p.numel() for m in (bert, gpt2) for p in m.parameters())
    print(f"encoder: {config.encoder.num_hidden_layers} layers, width {config.encoder.hidden_size}; decoder: "
          f"{config.decoder.n_layer} layers, width {config.decoder.n_embd}, vocabulary {config.decoder.vocab_size}; "
          f"batch {args.batch_size} x {args.length} tokens; {optimus_parameters / 1e6:.1f}M parameters (Optimus), "
          f"{plain_parameters / 1e6:.1f}M (BERT + GPT-2)")
    record("models", {"encoder_layers": config.encoder.num_hidden_layers, "encoder_width": config.encoder.hidden_size,
                      "decoder_layers": config.decoder.n_layer, "decoder_width": config.decoder.n_embd,
                      "decoder_vocabulary": config.decoder.vocab_size, "optimus_parameters": optimus_parameters,
                      "bert_and_gpt2_parameters": plain_parameters})

    def optimus_step():
        optimus.zero_grad(set_to_none=True)
        optimus(input_ids=input_ids, labels=labels).loss.backward()

    def plain_step():
        bert.zero_grad(set_to_none=True)
        gpt2.zero_grad(set_to_none=True)
        pooled = bert(input_ids=input_ids).pooler_output
        (gpt2(input_ids=labels, labels=labels).loss + pooled.mean()).backward()

    times = time_interleaved({"OptimusModel forward+backward": optimus_step,
                              "BertModel + GPT2LMHeadModel forward+backward": plain_step}, repeats,
                             section=f"training step, batch {args.batch_size} x {args.length}")
    report_ratio("train step time of OptimusModel / (BertModel + GPT2LMHeadModel)",
                 times["OptimusModel forward+backward"], times["BertModel + GPT2LMHeadModel forward+backward"], 1.10)
    finish()


if __name__ == "__main__":
    main()
