#!/usr/bin/env python
"""Evaluation of an MT-DNN SAN head at BERT-base size (batch 16 x 128 sentence pairs) against the encoder alone plus
the head's own cost, all measured in this run.

Three candidates, interleaved: the whole model (`MTDNNModel(..., task="mnli")`: BERT-base, 3 classes, the original's
5-turn SAN head with masks derived from the segments), its encoder alone (`model.bert`) and the SAN head alone on a
stored encoder output. The ratio whole / (encoder + head) shows what the model adds around them (task lookup, mask
derivation, checks); target <= 1.05x. The head's share of the whole is reported too.
On a machine shared with other work, `--threads 1` gives steadier timings.
"""

import statistics

import torch
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved
from transformers import BertConfig

from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel, premise_hypothesis_masks


def build(quick):
    encoder = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         vocab_size=1000) if quick else BertConfig()  # BERT-base
    task = {"name": "mnli", "type": "classification", "num_labels": 3, "head": "san"}  # train.py's SAN defaults
    torch.manual_seed(0)
    return MTDNNModel(MTDNNConfig(encoder=encoder, tasks=[task])).eval()


def pair_batch(vocab_size, batch_size, length, generator):
    """`[CLS] premise [SEP] hypothesis [SEP]` rows of `length` tokens, premises of 40-60% of the row."""
    input_ids = torch.randint(5, vocab_size, (batch_size, length), generator=generator)
    premise_lengths = torch.randint(int(0.4 * length), int(0.6 * length), (batch_size,), generator=generator)
    token_type_ids = (torch.arange(length) >= premise_lengths[:, None]).long()
    return input_ids, token_type_ids, torch.ones_like(input_ids)


def main(argv=None):
    parser = benchmark_parser(__doc__.splitlines()[1])
    parser.add_argument("--batch-size", type=int, default=16, help="sentence pairs per batch (default 16)")
    parser.add_argument("--length", type=int, default=128, help="tokens per pair (default 128)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=7, quick_repeats=2)
    model = build(args.quick)
    config = model.config.encoder
    input_ids, token_type_ids, attention_mask = pair_batch(config.vocab_size, args.batch_size, args.length,
                                                           torch.Generator().manual_seed(0))
    head = model.heads["mnli"]
    parameters = sum(p.numel() for p in model.parameters())
    head_parameters = sum(p.numel() for p in head.parameters())
    print(f"encoder: {config.num_hidden_layers} layers, width {config.hidden_size}; SAN head: "
          f"{head.num_turns} turns; batch {args.batch_size} x {args.length} tokens; "
          f"{parameters / 1e6:.1f}M parameters ({head_parameters / 1e6:.2f}M in the head)")
    record("model", {"encoder_layers": config.num_hidden_layers, "width": config.hidden_size,
                     "san_turns": head.num_turns, "parameters": parameters, "head_parameters": head_parameters})

    with torch.inference_mode():
        sequence_output = model.bert(input_ids=input_ids, token_type_ids=token_type_ids,
                                     attention_mask=attention_mask).last_hidden_state
        premise_mask, hypothesis_mask = premise_hypothesis_masks(token_type_ids, attention_mask)
        candidates = {
            "MTDNNModel (encoder + SAN head)": lambda: model(input_ids=input_ids, token_type_ids=token_type_ids,
                                                             attention_mask=attention_mask, task="mnli"),
            "encoder alone": lambda: model.bert(input_ids=input_ids, token_type_ids=token_type_ids,
                                                attention_mask=attention_mask),
            "SAN head alone": lambda: head(sequence_output, premise_mask, hypothesis_mask),
        }
        seconds = time_interleaved(candidates, repeats, section=f"evaluation, batch {args.batch_size} x {args.length}")
    whole, encoder, san = (seconds[name] for name in candidates)
    share = statistics.median(h / w for h, w in zip(san, whole, strict=True))
    print(f"SAN head share of the whole evaluation (median over rounds): {share:.1%}")
    record("san_head_share_of_the_evaluation", share)
    report_ratio("SAN-task evaluation time of MTDNNModel / (encoder alone + SAN head alone)", whole,
                 [e + h for e, h in zip(encoder, san, strict=True)], 1.05)
    finish()


if __name__ == "__main__":
    main()
