"""Length generalisation on the Universal Transformer paper's algorithmic tasks: train a small Universal Transformer
with ACT and the same-size vanilla Transformer (`hf_ext.training.vanilla_transformer`) on the same data, then compare
greedy char- and sequence-accuracy at the training lengths and at longer lengths. Prints a Markdown table (and, with
--json, every number) on stdout; the training logs go to stderr as JSON lines.

The default run (copy, inputs of length 1-10 for training, 11-20 for the longer test) takes a few minutes on two CPU
cores. The paper's setting (Table 4: training length 40, test length 400; 100000 training examples as tensor2tensor's
`algorithmic_*_decimal40`; here with the sizes of t2t's `universal_transformer_small` and its default of twice its
6 steps for ACT, and an illustrative step count) is

    python examples/ut_algorithmic.py --tasks reverse --train-length 40 --test-length 400 --num-train 100000 \
        --max-steps 50000 --batch-size 64 --hidden-size 512 --num-heads 8 --intermediate-size 2048 --act-max-steps 12

which needs a GPU (`--tasks copy reverse addition` runs all three).
"""

import argparse
import json

import torch

from hf_ext import UniversalTransformerForSeq2SeqLM
from hf_ext.commands.universal_transformer import add_algorithmic_arguments
from hf_ext.training.universal_transformer import TASKS, algorithmic_config, run_algorithmic, vanilla_transformer


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=["copy"], help="tasks to run (default copy)")
    # --max-steps counts the steps of each of the two models
    add_algorithmic_arguments(parser, train_length=10, test_length=20, max_steps=1200)
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the weights (default 0)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="also print every number as one JSON line per run")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.set_verbosity_error()
    config = algorithmic_config(hidden_size=args.hidden_size, num_attention_heads=args.num_heads,
                                intermediate_size=args.intermediate_size, act_max_steps=args.act_max_steps,
                                dropout=args.dropout)
    builders = {"Universal Transformer (ACT)": lambda: UniversalTransformerForSeq2SeqLM(config),
                f"Transformer ({config.act_max_steps} layers)": lambda: vanilla_transformer(config)}
    print(f"Training inputs up to length {args.train_length} (addition: from 3), longer test inputs of length "
          f"{args.train_length + 1}-{args.test_length}; greedy decoding.\n")
    print("| task | model | parameters | train s | char acc, train lengths | seq acc, train lengths "
          "| char acc, longer | seq acc, longer |")
    print("|---|---|---|---|---|---|---|---|")
    for task in args.tasks:
        for name, build in builders.items():
            torch.manual_seed(args.seed)
            run = run_algorithmic(task, build(), name, train_length=args.train_length, test_length=args.test_length,
                                  num_train=args.num_train, num_test=args.num_test, max_steps=args.max_steps,
                                  batch_size=args.batch_size, learning_rate=args.learning_rate, seed=args.seed,
                                  logging_steps=max(args.max_steps // 10, 1), log_to_stderr=True, disable_tqdm=True,
                                  use_cpu=not torch.cuda.is_available())
            same, longer = run.train_lengths, run.longer_lengths
            print(f"| {task} | {name} | {run.parameters:,} | {run.train_seconds:.0f} | "
                  f"{same['char_accuracy']:.3f} | {same['sequence_accuracy']:.3f} | "
                  f"{longer['char_accuracy']:.3f} | {longer['sequence_accuracy']:.3f} |", flush=True)
            if args.json:
                ponder = [entry["ponder_cost"] for entry in run.log_history if "ponder_cost" in entry]
                print(json.dumps({"task": task, "model": name, "parameters": run.parameters,
                                  "train_loss": run.train_loss, "train_seconds": run.train_seconds,
                                  "train_lengths": same, "longer_lengths": longer,
                                  "final_ponder_cost": ponder[-1] if ponder else None}), flush=True)


if __name__ == "__main__":
    main()
