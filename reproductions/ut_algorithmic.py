"""Universal Transformer, algorithmic tasks (Dehghani et al., ICLR 2019, section 3.3 and Table 4): copy, reverse and
addition over decimal digits. A Universal Transformer with ACT and the same-size vanilla Transformer
(`hf_ext.models.universal_transformer.training.vanilla_transformer`, as many layers as the Universal Transformer's
most steps) train on the same short inputs; both are tested on new inputs at the training lengths and at longer ones.

Two measurements of char- and sequence-accuracy:

- teacher forced, as tensor2tensor's evaluation (and so the paper's Table 4): the true targets are fed to the
  decoder and each next symbol is the argmax of the logits;
- greedy: free-running `generate()`, where an early mistake carries into the rest of the answer.

The Universal Transformer trains with positions starting at random offsets (`--position-offsets`, default the
training length), as the paper's section 3.3 says of its algorithmic runs; the Transformer baseline trains without,
as in the paper (`--position-offsets 0` trains both without, the ablation).

The default run (training inputs of length up to 10, longer test inputs of length 11-20) is for two CPU cores:

    python reproductions/ut_algorithmic.py --threads 1 --output ut_algorithmic.json --plot ut_algorithmic.png

The paper's lengths (train 40, test 400, 100,000 examples as tensor2tensor's `algorithmic_*_decimal40`), here with
the sizes of tensor2tensor's `universal_transformer_small`, ACT up to 12 steps and an unchosen step count, need a GPU:

    python reproductions/ut_algorithmic.py --train-length 40 --test-length 400 --num-train 100000 \\
        --max-steps 50000 --batch-size 64 --hidden-size 512 --num-heads 8 --intermediate-size 2048 --act-max-steps 12
"""

import torch
from common import finish, markdown_table, plotting, reproduction_parser, start

from hf_ext import UniversalTransformerForSeq2SeqLM
from hf_ext.models.universal_transformer.commands import add_algorithmic_arguments
from hf_ext.models.universal_transformer.training import (
    TASKS,
    algorithmic_config,
    run_algorithmic,
    vanilla_transformer,
)

RESULT_KEYS = ["settings", "paper_table_4", "runs"]
MODELS = ("universal_transformer", "transformer")
MODEL_NAMES = {"universal_transformer": "Universal Transformer (ACT)", "transformer": "Transformer"}
# Table 4 of the paper (v3): trained on length 40, tested on length 400
PAPER_TABLE_4 = {
    "copy": {"universal_transformer": {"char_accuracy": 0.91, "sequence_accuracy": 0.35},
             "transformer": {"char_accuracy": 0.53, "sequence_accuracy": 0.03}},
    "reverse": {"universal_transformer": {"char_accuracy": 0.96, "sequence_accuracy": 0.46},
                "transformer": {"char_accuracy": 0.13, "sequence_accuracy": 0.06}},
    "addition": {"universal_transformer": {"char_accuracy": 0.34, "sequence_accuracy": 0.02},
                 "transformer": {"char_accuracy": 0.07, "sequence_accuracy": 0.0}},
}
# a smoke run of the code in seconds, not a result
QUICK_SETTINGS = {"train_length": 4, "test_length": 6, "num_train": 128, "num_test": 8, "max_steps": 4,
                  "batch_size": 8, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32, "act_max_steps": 3}


def parse_args(argv=None):
    parser = reproduction_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="tasks (default all three)")
    add_algorithmic_arguments(parser, train_length=10, test_length=20, max_steps=1200)
    parser.add_argument("--position-offsets", type=int,
                        help="the Universal Transformer's training examples start at a random position below this "
                        "(default: --train-length; 0: no offsets)")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK_SETTINGS)
    if args.position_offsets is None:
        args.position_offsets = args.train_length
    return args


def build(model: str, config) -> torch.nn.Module:
    return UniversalTransformerForSeq2SeqLM(config) if model == "universal_transformer" else vanilla_transformer(config)


def accuracies(metrics: dict) -> dict:
    return {"char_accuracy": metrics["char_accuracy"], "sequence_accuracy": metrics["sequence_accuracy"]}


def train_and_test(task: str, model: str, config, args) -> dict:
    torch.manual_seed(args.seed)
    offsets = args.position_offsets if model == "universal_transformer" else 0
    run = run_algorithmic(task, build(model, config), MODEL_NAMES[model], train_length=args.train_length,
                          test_length=args.test_length, num_train=args.num_train, num_test=args.num_test,
                          max_steps=args.max_steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
                          seed=args.seed, position_offsets=offsets, logging_steps=max(args.max_steps // 10, 1),
                          log_to_stderr=True, disable_tqdm=True, use_cpu=not torch.cuda.is_available())
    ponder = [entry["ponder_cost"] for entry in run.log_history if "ponder_cost" in entry]
    return {"parameters": run.parameters, "position_offsets": offsets, "train_loss": run.train_loss,
            "train_seconds": round(run.train_seconds, 1), "final_ponder_cost": ponder[-1] if ponder else None,
            "train_lengths": {"teacher_forced": accuracies(run.teacher_forced_train_lengths),
                              "greedy": accuracies(run.train_lengths)},
            "longer_lengths": {"teacher_forced": accuracies(run.teacher_forced_longer_lengths),
                               "greedy": accuracies(run.longer_lengths)}}


def pair(metrics: dict) -> str:
    return f"{metrics['char_accuracy']:.2f} / {metrics['sequence_accuracy']:.2f}"


def table(runs: dict, args) -> str:
    shortest = {task: 3 if task == "addition" else 1 for task in runs}
    headers = ["task", "model", "paper, length 400", "teacher forced, training lengths",
               f"teacher forced, {args.train_length + 1}-{args.test_length}", "greedy, training lengths",
               f"greedy, {args.train_length + 1}-{args.test_length}"]
    rows = []
    for task, by_model in runs.items():
        for model, run in by_model.items():
            rows.append([f"{task} (training {shortest[task]}-{args.train_length})", MODEL_NAMES[model],
                         pair(PAPER_TABLE_4[task][model]),
                         pair(run["train_lengths"]["teacher_forced"]), pair(run["longer_lengths"]["teacher_forced"]),
                         pair(run["train_lengths"]["greedy"]), pair(run["longer_lengths"]["greedy"])])
    return markdown_table(headers, rows)


def plot(pyplot, runs: dict, args) -> None:
    """Char accuracy beyond the training lengths, per task: teacher forced and greedy here, the paper's beside."""
    figure, axes = pyplot.subplots(1, len(runs), figsize=(4 * len(runs), 3.6), squeeze=False)
    measures = (("teacher forced", lambda run, task, model: run["longer_lengths"]["teacher_forced"]),
                ("greedy", lambda run, task, model: run["longer_lengths"]["greedy"]),
                ("paper (length 400)", lambda run, task, model: PAPER_TABLE_4[task][model]))
    width = 0.8 / len(measures)
    for axis, (task, by_model) in zip(axes[0], runs.items(), strict=True):
        for index, (label, measure) in enumerate(measures):
            values = [measure(by_model[model], task, model)["char_accuracy"] for model in MODELS]
            axis.bar([m + (index - 1) * width for m in range(len(MODELS))], values, width, label=label)
        axis.set_xticks(range(len(MODELS)), ["UT (ACT)", "Transformer"])
        axis.set_ylim(0, 1)
        axis.set_title(f"{task}: lengths {args.train_length + 1}-{args.test_length}")
    axes[0][0].set_ylabel("char accuracy")
    axes[0][-1].legend(fontsize=8)
    figure.suptitle(f"Universal Transformer, Table 4\ntrained on lengths up to {args.train_length}", fontsize=10)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=100)
    print(f"wrote {args.plot}")


def main(argv=None):
    args = parse_args(argv)
    started = start(args)
    pyplot = plotting(args)
    config = algorithmic_config(hidden_size=args.hidden_size, num_attention_heads=args.num_heads,
                                intermediate_size=args.intermediate_size, act_max_steps=args.act_max_steps,
                                dropout=args.dropout)
    runs = {}
    for task in args.tasks:
        runs[task] = {}
        for model in MODELS:
            runs[task][model] = train_and_test(task, model, config, args)
            print(f"{task}, {MODEL_NAMES[model]}: {runs[task][model]['train_seconds']} s of training", flush=True)
    print(f"\nTrained on inputs of length up to {args.train_length} (addition from 3), {args.num_train} examples, "
          f"{args.max_steps} steps of {args.batch_size}; {args.num_test} test inputs per length range; "
          "char / sequence accuracy.\n")
    print(table(runs, args) + "\n")
    settings = {name: getattr(args, name) for name in (
        "tasks", "train_length", "test_length", "num_train", "num_test", "max_steps", "batch_size", "learning_rate",
        "hidden_size", "num_heads", "intermediate_size", "act_max_steps", "dropout", "position_offsets")}
    if pyplot is not None:
        plot(pyplot, runs, args)
    finish(args, started, {"settings": settings, "paper_table_4": PAPER_TABLE_4, "runs": runs})


if __name__ == "__main__":
    main()
