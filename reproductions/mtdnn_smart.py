"""SMART (Jiang et al., ACL 2020) in MT-DNN: does smoothness-inducing adversarial regularisation help multi-task
training, most on the small task, and on an encoder other than BERT?

The SMART paper reports that adding its adversarial regulariser to fine-tuning improves GLUE dev scores of BERT and
RoBERTa, with the largest gains on the small tasks (RTE, MRPC, CoLA, STS-B), where fine-tuning overfits most. This
script asks the same of the MT-DNN reproduction's setting (`mtdnn_multitask.py`, whose generated tasks, vocabulary,
recipe and model size it imports): per seed, four multi-task models on all five tasks, BERT and RoBERTa, each plain
and with SMART (`MTDNNTrainer(smart=...)`), and their per-task dev metrics.

RoBERTa is the non-BERT encoder because it is SMART's other encoder in the paper (SMART-RoBERTa) and the one whose
tiny config fits the BERT-style WordPiece vocabulary the script trains with the fewest changes: its padding id is
the vocabulary's `[PAD]` (0), so its positions start at 1 and it gets `MAX_LENGTH + 1` position embeddings; it has
one segment, as the released checkpoints (a pair's sentences are told apart by `[SEP]` alone). Trained from scratch,
it differs from the BERT encoder only in those two points: RoBERTa's other differences lie in its pre-training,
which no model here has.

SMART's settings are MT-DNN's `--adv_*` defaults (`SmartSettings`: alpha 1, k 1, noise variance 1e-5, epsilon 1e-6,
per-token inf norm) except the ascent step size, 1e-3 as the SMART paper states (MT-DNN's train.py default is 1e-5).
The choice barely matters here: on a batch of 32 RTE rows, the step's move (step size x the divergence's gradient) is
1e-5 of the initial noise (per token, median) on the fresh BERT model and 1e-4 after 1,500 plain steps (1e-7 and 1e-6
with 1e-5), so after the normalisation the perturbation is the random initial noise scaled to an inf norm of 1 per
token: at these defaults, SMART here trains consistency under random perturbations of the embeddings more than
under adversarial ones.

Budget: a SMART step (a clean forward, two perturbed forwards and their backward passes) cost 2.3 plain ones in a
process alone, 2 to 4 when two runs share the cores. Timed on the reference machine (2 cores, shared with other
work), 200 steps of each model with two seeds at once, one thread each, took 7.4 s (BERT), 15.2 s (BERT + SMART),
5.5 s (RoBERTa) and 28.0 s (RoBERTa + SMART) at a load of 1 to 2, 12.5, 29.1, 17.0 and 35.1 s at a load of 3, and
at 400 steps and a load of 4 to 5 twice as long again per step. At the default 2,000 steps (the MT-DNN reproduction
trains 2,500; at 1,500 the plain models are clearly less trained), the full run below (three seeds, two at a time,
so two rounds) takes about 20 minutes on a quiet machine, about 31 at a load of 3 and about 44 at a load of 4 to 5:

    python reproductions/mtdnn_smart.py --jobs 2 --threads 1 --output reproductions/results/mtdnn_smart.json \\
        --plot docs/images/mtdnn_smart.png
"""

import dataclasses
import tempfile
import time
from pathlib import Path

import mtdnn_multitask as multitask
import numpy as np
from common import holds, main, markdown_table, reproduction_parser, spread, values
from transformers import RobertaConfig

from hf_ext.models.mtdnn.smart import SmartSettings

RESULT_KEYS = ["tasks", "dev", "smart", "recipe", "encoders", "seconds_per_run"]  # per seed

SMART = SmartSettings(step_size=1e-3)  # the paper's ascent step; the rest MT-DNN's train.py defaults
ENCODERS = {"bert": "BERT", "roberta": "RoBERTa"}
VARIANTS = {"plain": "", "smart": " + SMART"}
SMALL_TASK = "rte"
# each task's dev metric in the tables and claims (STS-B: Pearson's r, the others accuracy)
METRIC = {"rte": "accuracy", "sst": "accuracy", "mnli": "accuracy", "stsb": "pearson", "qnnli": "accuracy"}
DEFAULT_STEPS = 2000


def roberta_config(tokenizer, hidden: int) -> RobertaConfig:
    """A RoBERTa of the BERT encoder's sizes over the same WordPiece vocabulary: padding at the vocabulary's
    `[PAD]`, positions counted from the one after it (RoBERTa's offset), one segment."""
    pad = tokenizer.pad_token_id
    return RobertaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         max_position_embeddings=multitask.MAX_LENGTH + pad + 1, pad_token_id=pad,
                         bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, type_vocab_size=1,
                         **multitask.ENCODER_SIZES)


def parser():
    parser = reproduction_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"multi-task training steps of each model (default {DEFAULT_STEPS})")
    return parser


def run(args) -> dict:
    """One seed: BERT and RoBERTa, each plain and with SMART, multi-task on all five tasks."""
    if args.quick:
        sizes, steps, hidden, batch_size = multitask.QUICK_SIZES, 6, 32, 8
    else:
        sizes, steps, hidden, batch_size = multitask.SIZES, args.steps, 64, 32
    learning_rate = 1e-3
    dev: dict = {encoder: {} for encoder in ENCODERS}
    seconds, parameters = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        tokenizer, data = multitask.prepare_tasks(scratch, sizes, args.seed)
        configs = {"bert": None, "roberta": roberta_config(tokenizer, hidden)}  # None: the reproduction's BERT
        number = 0
        for encoder, name in ENCODERS.items():
            for variant, suffix in VARIANTS.items():
                number += 1
                print(f"seed {args.seed}: {number}. {name}{suffix}", flush=True)
                model = multitask.build_model(tokenizer, hidden, args.seed, configs[encoder])
                parameters[encoder] = sum(p.numel() for p in model.parameters())
                started = time.perf_counter()
                dev[encoder][variant] = multitask.train(
                    model, data["train"], data["dev"], steps, args.seed, scratch / f"{encoder}-{variant}",
                    learning_rate, batch_size, smart=SMART if variant == "smart" else None)
                seconds[f"{encoder}_{variant}"] = round(time.perf_counter() - started, 1)
                print(f"seed {args.seed}: {name}{suffix}: {seconds[f'{encoder}_{variant}']} s; "
                      + ", ".join(f"{task} {dev[encoder][variant][task][METRIC[task]]:.3f}" for task in METRIC),
                      flush=True)
    return {
        "data": {"source": "generated GLUE-shaped tasks (mtdnn_multitask.py)", "sizes": sizes,
                 "label_noise": multitask.LABEL_NOISE},
        "recipe": {"optimizer": "adamax", "learning_rate": learning_rate, "warmup": 0.1, "max_grad_norm": 1.0,
                   "steps": steps, "batch_size": batch_size, "hidden": hidden},
        "encoders": {encoder: {"parameters": parameters[encoder]} for encoder in ENCODERS},
        "smart": dataclasses.asdict(SMART),
        "tasks": list(sizes),
        "dev": dev,
        "seconds_per_run": seconds,
    }


def score(seed: dict, encoder: str, variant: str, task: str) -> float:
    """A seed's dev metric of one task (`METRIC`) for one model, in percent (STS-B: Pearson's r x 100)."""
    return 100 * seed["dev"][encoder][variant][task][METRIC[task]]


def gain(seed: dict, encoder: str, task: str) -> float:
    """SMART's gain over the plain model of the same encoder on one task, in points."""
    return score(seed, encoder, "smart", task) - score(seed, encoder, "plain", task)


def claims(tasks: list[str]) -> list[tuple[str, object]]:
    """The SMART paper's claims, and the encoders' comparison, as tests of one seed's figures."""
    others = [task for task in tasks if task != SMALL_TASK]
    found: list[tuple[str, object]] = []
    for encoder, name in ENCODERS.items():
        found.append((f"{SMALL_TASK} (the small task): SMART beats plain, {name}",
                      lambda seed, e=encoder: gain(seed, e, SMALL_TASK) > 0))
        for task in others:
            found.append((f"{task}: SMART beats plain, {name}", lambda seed, e=encoder, t=task: gain(seed, e, t) > 0))
        found.append((f"SMART gains more on {SMALL_TASK} than on the other tasks' mean, {name}",
                      lambda seed, e=encoder: gain(seed, e, SMALL_TASK)
                      > float(np.mean([gain(seed, e, t) for t in others]))))
    for variant in VARIANTS:
        for task in tasks:
            found.append((f"{task}: RoBERTa beats BERT, {'both with SMART' if variant == 'smart' else 'both plain'}",
                          lambda seed, v=variant, t=task: score(seed, "roberta", v, t) > score(seed, "bert", v, t)))
    return found


def tables(results: dict) -> str:
    """Every task's dev metric for the four models and SMART's gains (mean ± standard deviation over the seeds),
    then the claims, seed by seed."""
    first = results["per_seed"][0]
    tasks = first["tasks"]
    models = [(encoder, variant) for encoder in ENCODERS for variant in VARIANTS]
    rows = [[f"{task} ({'Pearson x 100' if METRIC[task] == 'pearson' else 'accuracy %'}, "
             f"{first['data']['sizes'][task][0]:,} train)"]
            + [spread(values(results, lambda seed, e=e, v=v, t=task: score(seed, e, v, t)), 1) for e, v in models]
            for task in tasks]
    gain_rows = [[task] + [spread(values(results, lambda seed, e=e, t=task: gain(seed, e, t)), 1) for e in ENCODERS]
                 for task in tasks]
    claim_rows = [[claim, holds(results, test)] for claim, test in claims(tasks)]
    recipe = first["recipe"]
    return "\n\n".join([
        markdown_table(["dev metric", *(f"{ENCODERS[e]}{VARIANTS[v]}" for e, v in models)], rows)
        + f"\n\n{recipe['steps']:,} multi-task steps each; "
        + ", ".join(f"{ENCODERS[e]} {first['encoders'][e]['parameters']:,}" for e in ENCODERS)
        + " parameters, heads included",
        markdown_table(["SMART's gain (points)", *ENCODERS.values()], gain_rows),
        markdown_table(["claim", "holds in (seeds)"], claim_rows)])


def draw(pyplot, results: dict, path) -> None:
    """Every task's dev metric for the four models, and SMART's gain per task and encoder: means over the seeds,
    standard deviations as error bars."""
    def bar_values(read):
        numbers = np.array(values(results, read))
        return numbers.mean(), numbers.std(ddof=1) if len(numbers) > 1 else 0.0

    tasks = results["per_seed"][0]["tasks"]
    positions = np.arange(len(tasks))
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    models = [(encoder, variant) for encoder in ENCODERS for variant in VARIANTS]
    colors = {("bert", "plain"): "#9ecae1", ("bert", "smart"): "#2171b5", ("roberta", "plain"): "#fdae6b",
              ("roberta", "smart"): "#d94801"}
    width = 0.2
    for index, (encoder, variant) in enumerate(models):
        bars = [bar_values(lambda seed, t=task, e=encoder, v=variant: score(seed, e, v, t)) for task in tasks]
        left.bar(positions + (index - 1.5) * width, [m for m, _ in bars], width=width, yerr=[d for _, d in bars],
                 capsize=2, color=colors[encoder, variant], label=f"{ENCODERS[encoder]}{VARIANTS[variant]}")
    left.set_xticks(positions, [f"{task}\n({'r' if METRIC[task] == 'pearson' else 'acc'})" for task in tasks])
    left.set_ylabel("dev metric (x 100)")
    left.set_ylim(0, 100)
    left.set_title("the four multi-task models")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize=8)
    for index, encoder in enumerate(ENCODERS):
        bars = [bar_values(lambda seed, t=task, e=encoder: gain(seed, e, t)) for task in tasks]
        right.bar(positions + (index - 0.5) * 0.35, [m for m, _ in bars], width=0.35, yerr=[d for _, d in bars],
                  capsize=2, color=colors[encoder, "smart"], label=ENCODERS[encoder])
    right.axhline(0, color="black", linewidth=0.8)
    right.set_xticks(positions, tasks)
    right.set_ylabel("SMART - plain (points)")
    right.set_title(f"SMART's gain ({SMALL_TASK}: the small task)")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    figure.suptitle(f"MT-DNN with SMART (mean over {len(results['seeds'])} seeds)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main(parser(), run, tables, draw)
