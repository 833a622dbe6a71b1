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
as in the paper; the ablation, the Universal Transformer without offsets, runs beside them (`--models` picks).

The default run (training inputs of length up to 10, longer test inputs of length 11-20) is for two CPU cores:

    python reproductions/ut_algorithmic.py --jobs 2 --threads 1 --output ut_algorithmic.json --plot ut_algorithmic.png

The paper's lengths (train 40, test 400, 100,000 examples as tensor2tensor's `algorithmic_*_decimal40`), here with
the sizes of tensor2tensor's `universal_transformer_small`, ACT up to 12 steps and an unchosen step count, need a GPU:

    python reproductions/ut_algorithmic.py --train-length 40 --test-length 400 --num-train 100000 \\
        --max-steps 50000 --batch-size 64 --hidden-size 512 --num-heads 8 --intermediate-size 2048 --act-max-steps 12
"""

import torch
from common import holds, main, markdown_table, reproduction_parser, spread, values

from hf_ext import UniversalTransformerForSeq2SeqLM
from hf_ext.models.universal_transformer.commands import add_algorithmic_arguments
from hf_ext.models.universal_transformer.training import (
    TASKS,
    algorithmic_config,
    run_algorithmic,
    vanilla_transformer,
)

RESULT_KEYS = ["settings", "paper_table_4", "runs"]  # of each seed
MODELS = ("universal_transformer", "universal_transformer_no_offsets", "transformer")
MODEL_NAMES = {"universal_transformer": "Universal Transformer (ACT)",
               "universal_transformer_no_offsets": "Universal Transformer (ACT), no offsets (ablation)",
               "transformer": "Transformer"}
PAPER_MODEL = {"universal_transformer": "universal_transformer", "universal_transformer_no_offsets": None,
               "transformer": "transformer"}
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


def parser():
    parser = reproduction_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="tasks (default all three)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="models (default all three: the Universal Transformer with and without position offsets, "
                        "and the Transformer)")
    add_algorithmic_arguments(parser, train_length=10, test_length=20, max_steps=1200)
    parser.add_argument("--position-offsets", type=int,
                        help="the Universal Transformer's training examples start at a random position below this "
                        "(default: --train-length; 0: no offsets)")
    return parser


def prepare(args) -> None:
    """--quick's sizes, and the offsets' default bound, the training length."""
    if args.quick:
        vars(args).update(QUICK_SETTINGS)
    if args.position_offsets is None:
        args.position_offsets = args.train_length


def build(model: str, config) -> torch.nn.Module:
    return vanilla_transformer(config) if model == "transformer" else UniversalTransformerForSeq2SeqLM(config)


def accuracies(metrics: dict) -> dict:
    return {"char_accuracy": metrics["char_accuracy"], "sequence_accuracy": metrics["sequence_accuracy"]}


def train_and_test(task: str, model: str, config, args) -> dict:
    torch.manual_seed(args.seed)
    offsets = args.position_offsets if model == "universal_transformer" else 0  # the paper's Transformer: none
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


def cell(results: dict, task: str, model: str, lengths: str, measure: str) -> str:
    def read(key):
        return spread(values(results, lambda seed: seed["runs"][task][model][lengths][measure][key]))

    return f"{read('char_accuracy')} / {read('sequence_accuracy')}"


def paper(task: str, model: str) -> str:
    reference = PAPER_MODEL[model]
    if reference is None:
        return ""
    scores = PAPER_TABLE_4[task][reference]
    return f"{scores['char_accuracy']:.2f} / {scores['sequence_accuracy']:.2f}"


def claims(tasks: list[str], models: list[str]) -> list[tuple[str, object]]:
    """Table 4's claim, task by task, as tests of one seed's figures (teacher forced beyond the training lengths,
    the paper's measurement), and what the ablation separates."""
    def score(seed, task, model, key):
        return seed["runs"][task][model]["longer_lengths"]["teacher_forced"][key]

    found = []
    for task in tasks:
        if {"universal_transformer", "transformer"} <= set(models):
            for key, measure in (("char_accuracy", "char"), ("sequence_accuracy", "sequence")):
                found.append((f"{task}: the UT with offsets beats the Transformer beyond the training lengths "
                              f"({measure} accuracy, teacher forced)",
                              lambda seed, t=task, k=key: score(seed, t, "universal_transformer", k)
                              > score(seed, t, "transformer", k)))
        if {"universal_transformer", "universal_transformer_no_offsets"} <= set(models):
            found.append((f"{task}: the offsets help the UT beyond the training lengths (char accuracy, teacher "
                          "forced)",
                          lambda seed, t=task: score(seed, t, "universal_transformer", "char_accuracy")
                          > score(seed, t, "universal_transformer_no_offsets", "char_accuracy")))
        if "universal_transformer" in models:
            found.append((f"{task}: the UT with offsets fits the training lengths (char accuracy >= 0.95, teacher "
                          "forced)",
                          lambda seed, t=task: seed["runs"][t]["universal_transformer"]["train_lengths"][
                              "teacher_forced"]["char_accuracy"] >= 0.95))
    return found


def tables(results: dict) -> str:
    """Char / sequence accuracy (mean ± standard deviation over the seeds) of every task and model, both
    measurements, beside the paper's; then Table 4's claims, seed by seed."""
    settings = results["per_seed"][0]["settings"]
    longer = f"{settings['train_length'] + 1}-{settings['test_length']}"
    runs = results["per_seed"][0]["runs"]
    headers = ["task", "model", "paper, length 400", "teacher forced, training lengths", f"teacher forced, {longer}",
               "greedy, training lengths", f"greedy, {longer}"]
    rows = [[task, MODEL_NAMES[model], paper(task, model),
             cell(results, task, model, "train_lengths", "teacher_forced"),
             f"**{cell(results, task, model, 'longer_lengths', 'teacher_forced')}**",
             cell(results, task, model, "train_lengths", "greedy"),
             cell(results, task, model, "longer_lengths", "greedy")]
            for task, by_model in runs.items() for model in by_model]
    parameters = {MODEL_NAMES[model]: f"{run['parameters']:,}" for model, run in next(iter(runs.values())).items()}
    ponder = [[task, spread(values(results, lambda seed, t=task: seed["runs"][t]["universal_transformer"][
        "final_ponder_cost"]), 1)] for task in runs if "universal_transformer" in runs[task]]
    text = markdown_table(headers, rows) + "\n\nparameters: " + "; ".join(
        f"{name} {count}" for name, count in parameters.items())
    if ponder:
        text += ("\n\nponder cost of the UT with offsets at the last logged step (encoder plus decoder steps per "
                 f"position, at most {2 * settings['act_max_steps']}): "
                 + "; ".join(f"{task} {value}" for task, value in ponder))
    claim_rows = [[claim, holds(results, test)] for claim, test in claims(list(runs), list(next(iter(
        runs.values())))) ]
    return text + "\n\n" + markdown_table(["claim", "holds in (seeds)"], claim_rows)


def draw(pyplot, results: dict, path) -> None:
    """Char accuracy beyond the training lengths, per task and model: teacher forced and greedy (means over the
    seeds, standard deviations as error bars), the paper's beside."""
    settings = results["per_seed"][0]["settings"]
    runs = results["per_seed"][0]["runs"]
    tasks = list(runs)
    models = list(runs[tasks[0]])
    figure, axes = pyplot.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.8), squeeze=False)
    measures = ("teacher_forced", "greedy", "paper")
    width = 0.8 / len(measures)
    for axis, task in zip(axes[0], tasks, strict=True):
        for index, measure in enumerate(measures):
            means, deviations = [], []
            for model in models:
                if measure == "paper":
                    reference = PAPER_MODEL[model]
                    means.append(PAPER_TABLE_4[task][reference]["char_accuracy"] if reference else 0.0)
                    deviations.append(0.0)
                    continue
                scores = torch.tensor(values(results, lambda seed, t=task, m=model, k=measure: seed["runs"][t][m][
                    "longer_lengths"][k]["char_accuracy"]))
                means.append(scores.mean().item())
                deviations.append(scores.std().item() if len(scores) > 1 else 0.0)
            axis.bar([m + (index - 1) * width for m in range(len(models))], means, width, yerr=deviations, capsize=3,
                     label={"teacher_forced": "teacher forced", "greedy": "greedy",
                            "paper": "paper (length 400)"}[measure])
        axis.set_xticks(range(len(models)), [{"universal_transformer": "UT (ACT)",
                                              "universal_transformer_no_offsets": "UT, no offsets",
                                              "transformer": "Transformer"}[model] for model in models], fontsize=8)
        axis.set_ylim(0, 1)
        axis.set_title(f"{task}: lengths {settings['train_length'] + 1}-{settings['test_length']}")
    axes[0][0].set_ylabel("char accuracy")
    axes[0][-1].legend(fontsize=8)
    figure.suptitle(f"Universal Transformer, Table 4: trained on lengths up to {settings['train_length']} "
                    f"(mean over {len(results['seeds'])} seeds)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def run(args) -> dict:
    """One seed: every model trained and tested on every task."""
    config = algorithmic_config(hidden_size=args.hidden_size, num_attention_heads=args.num_heads,
                                intermediate_size=args.intermediate_size, act_max_steps=args.act_max_steps,
                                dropout=args.dropout)
    runs = {}
    for task in args.tasks:
        runs[task] = {}
        for model in args.models:
            runs[task][model] = train_and_test(task, model, config, args)
            print(f"seed {args.seed}: {task}, {MODEL_NAMES[model]}: {runs[task][model]['train_seconds']} s of "
                  "training", flush=True)
    settings = {name: getattr(args, name) for name in (
        "tasks", "models", "train_length", "test_length", "num_train", "num_test", "max_steps", "batch_size",
        "learning_rate", "hidden_size", "num_heads", "intermediate_size", "act_max_steps", "dropout",
        "position_offsets")}
    return {"settings": settings, "paper_table_4": PAPER_TABLE_4, "runs": runs}


if __name__ == "__main__":
    main(parser(), run, tables, draw, prepare=prepare)
