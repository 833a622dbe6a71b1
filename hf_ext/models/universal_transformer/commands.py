"""`hf-ext universal-transformer ...`: train a Universal Transformer (or the same-size vanilla Transformer) on one of
the paper's algorithmic tasks, and plot the halting map of an input."""

import argparse
import json

from ...arguments import fraction, positive_float, positive_int
from ...cli_utils import (
    add_device_arguments,
    add_model_argument,
    add_run_reporting_arguments,
    model_commands,
    model_loading_settings,
    run_reporting_settings,
    training_device_settings,
)
from ...errors import require
from . import conversion
from .loading import load_model_and_tokenizer


def register(commands: argparse._SubParsersAction) -> None:
    """The `hf-ext universal-transformer` commands."""
    tools = model_commands(commands, conversion.CONVERT_NAME, "Universal Transformer training and halting maps",
                           "Train a Universal Transformer on an algorithmic task, or plot how long "
                           "each position of an input ponders.")

    parser = tools.add_parser(
        "train-algorithmic", help="train on copy, reverse or addition and test at longer lengths",
        description="Train a small model on one of the paper's algorithmic tasks (inputs of length up to "
        "--train-length), then measure greedy char- and sequence-accuracy at the training lengths and at the longer "
        "lengths up to --test-length. Saves the model, its tokenizer, results.json and log_history.json (written "
        "atomically) and prints the results as JSON.")
    parser.add_argument("--task", required=True, choices=("copy", "reverse", "addition"), help="the task")
    parser.add_argument("--output-dir", required=True, help="folder for the trained model")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    parser.add_argument("--architecture", choices=("universal-transformer", "transformer"),
                        default="universal-transformer",
                        help="the Universal Transformer with ACT (default) or the same-size vanilla Transformer")
    add_algorithmic_arguments(parser, train_length=20, test_length=40, max_steps=1500)
    parser.add_argument("--logging-steps", type=positive_int, default=100,
                        help="steps per logged average (default 100)")
    add_run_reporting_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the weights (default 0)")
    add_device_arguments(parser, training=True)
    parser.set_defaults(handler=_train_algorithmic)

    parser = tools.add_parser(
        "halting-map", help="plot the ponder time of each position of an input",
        description="Plot the halting map of TEXT: the ponder time N + R of every encoder position and, for a "
        "seq2seq model, of every position of its greedy output. Prints the values as JSON.")
    add_model_argument(parser, "Universal Transformer folder or Hub repo id (with its tokenizer)")
    parser.add_argument("text", help="the input, e.g. 1234567 for a model trained with train-algorithmic")
    parser.add_argument("out", help="image to write (PNG, or another format matplotlib knows from the suffix)")
    parser.add_argument("--max-new-tokens", type=positive_int,
                        help="longest greedy output of a seq2seq model (default: the input length plus one)")
    add_device_arguments(parser)
    parser.set_defaults(handler=_halting_map)


def add_algorithmic_arguments(parser: argparse.ArgumentParser, train_length: int, test_length: int,
                              max_steps: int) -> None:
    """The data, model-size and optimisation options of an algorithmic-task run (also used by
    reproductions/ut_algorithmic.py, with its own defaults for the lengths and the step count)."""
    parser.add_argument("--train-length", type=positive_int, default=train_length,
                        help=f"longest training input (default {train_length})")
    parser.add_argument("--test-length", type=positive_int, default=test_length,
                        help=f"longest test input (default {test_length})")
    parser.add_argument("--num-train", type=positive_int, default=20000, help="training examples (default 20000)")
    parser.add_argument("--num-test", type=positive_int, default=200,
                        help="test examples per length range (default 200)")
    parser.add_argument("--max-steps", type=positive_int, default=max_steps,
                        help=f"optimizer steps (default {max_steps})")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="examples per batch (default 32)")
    parser.add_argument("--learning-rate", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument("--hidden-size", type=positive_int, default=64, help="model width (default 64)")
    parser.add_argument("--num-heads", type=positive_int, default=4, help="attention heads (default 4)")
    parser.add_argument("--intermediate-size", type=positive_int, default=256,
                        help="transition inner width (default 256)")
    parser.add_argument("--act-max-steps", type=positive_int, default=6,
                        help="most ACT steps; the vanilla Transformer gets this many layers (default 6)")
    parser.add_argument("--dropout", type=fraction, default=0.1, help="dropout everywhere (default 0.1)")


def _train_algorithmic(args):
    import torch

    from ...hub import Evaluation, write_training_card
    from ...output import check_output_dir
    from ...trainer import training_run_output
    from . import UniversalTransformerForSeq2SeqLM
    from .training import algorithmic_config, algorithmic_tokenizer, run_algorithmic, vanilla_transformer

    require(args.task != "addition" or args.train_length >= 3, "addition needs --train-length of at least 3")
    require(args.test_length > args.train_length, "--test-length must exceed --train-length")
    require(args.hidden_size % args.num_heads == 0, "--hidden-size must be divisible by --num-heads")
    device_settings = training_device_settings(args)
    check_output_dir(args.output_dir, args.overwrite)
    config = algorithmic_config(hidden_size=args.hidden_size, num_attention_heads=args.num_heads,
                                intermediate_size=args.intermediate_size, act_max_steps=args.act_max_steps,
                                dropout=args.dropout)
    torch.manual_seed(args.seed)
    if args.architecture == "transformer":
        model = vanilla_transformer(config)
    else:
        model = UniversalTransformerForSeq2SeqLM(config)
    run = run_algorithmic(args.task, model, args.architecture, train_length=args.train_length,
                          test_length=args.test_length, num_train=args.num_train, num_test=args.num_test,
                          max_steps=args.max_steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
                          seed=args.seed, logging_steps=args.logging_steps, log_to_stderr=True,
                          **run_reporting_settings(args), **device_settings)
    results = {"task": args.task, "architecture": args.architecture, "parameters": run.parameters,
               "train_length": args.train_length, "test_length": args.test_length,
               "max_steps": args.max_steps, "train_loss": run.train_loss,
               "train_seconds": round(run.train_seconds, 1), "train_lengths": run.train_lengths,
               "longer_lengths": run.longer_lengths}
    # under torchrun, every process gathers the weights and the main one alone writes (the UT's folder gets the
    # text-to-text pipeline there; the Transformer baseline's class fits none)
    with training_run_output(args.output_dir, run.trainer, algorithmic_tokenizer(), model=model,
                             overwrite=args.overwrite) as staging:
        if staging is None:  # another process of a distributed run: the main one writes the output
            return
        (staging / "results.json").write_text(json.dumps(results, indent=1))
        write_training_card(staging, args.output_dir, args,
                            "hf-ext universal-transformer train-algorithmic", None, run.log_history,
                            [Evaluation("text2text-generation", f"{args.task}, {args.num_test} generated examples "
                                        f"of {lengths}", measured)
                             for lengths, measured in ((f"the training lengths (up to {args.train_length})",
                                                        run.train_lengths),
                                                       (f"lengths {args.train_length + 1} to {args.test_length}",
                                                        run.longer_lengths))])
    print(json.dumps({"output_dir": str(args.output_dir), **results}))


def _halting_map(args):
    from pathlib import Path

    from ...plots import require_matplotlib
    from .halting_map import halting_map, plot_halting_map

    out = Path(args.out)
    require(out.parent.is_dir(), f"the folder of {out} does not exist")
    require_matplotlib()
    model, tokenizer = load_model_and_tokenizer(args.model, args.trust_remote_code, **model_loading_settings(args))
    rows = halting_map(model, tokenizer, args.text, max_new_tokens=args.max_new_tokens)
    plot_halting_map(rows, out, title=f"Halting map of {args.text!r}")
    print(json.dumps({"out": str(out), "rows": [{"side": row.side, "tokens": row.tokens,
                                                 "ponder_time": row.ponder_time} for row in rows]}))
