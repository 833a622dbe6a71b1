"""MT-DNN (Liu et al., ACL 2019): multi-task learning helps a small task (paper Table 2: MT-DNN over single-task
BERT, most on RTE, the smallest), and distillation from an ensemble beats training on hard labels (MT-DNN-KD, Liu
et al. 2019, "Improving Multi-Task Deep Neural Networks via Knowledge Distillation", Table 2).

Data: five generated GLUE-shaped tasks over one small artificial language, written as GLUE TSV files in the
layouts of SST-2, MNLI, STS-B, QNLI and RTE and read back with `load_glue_tsv` (QNLI as pairwise ranking, as the
original's `qnnli`). Every task depends on the same two word features, a noun's identity and an adjective's
polarity; RTE, the small task (a few hundred rows), is two-way entailment of the premise's polarity, as MNLI (a
large task) is three-way, and needs the polarity of every adjective, which the large tasks teach. 10% of the
classification training labels are flipped, as annotation noise.

Recipe: the paper's (Adamax, linear decay after a 0.1 warm-up, gradient clipping at 1, dropout 0.3 for MNLI and
0.1 elsewhere, the original's task mixing), from a freshly initialised small BERT, so with a learning rate suited
to training from scratch instead of the paper's 5e-5 for fine-tuning BERT-base.

Three seeds, two at a time, one thread each:

    python reproductions/mtdnn_multitask.py --jobs 2 --threads 1 --output mtdnn.json --plot mtdnn.png
"""

import tempfile
from pathlib import Path

import numpy as np
import torch
from common import holds, main, markdown_table, reproduction_parser, spread, values
from transformers import BertConfig, BertTokenizer, TrainingArguments

from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel
from hf_ext.models.mtdnn.data import load_glue_tsv
from hf_ext.models.mtdnn.distillation import add_soft_labels, teacher_soft_labels
from hf_ext.models.mtdnn.smart import SmartSettings
from hf_ext.models.mtdnn.training import MTDNNTrainer, evaluate_task
from hf_ext.sample_text import train_bert_vocab
from hf_ext.trainer import send_logs_to_stderr

RESULT_KEYS = ["tasks", "single_task", "multi_task", "multi_task_fine_tuned", "distillation", "paper"]  # per seed

NOUNS = ("apple", "river", "teacher", "garden", "engine", "city", "letter", "window", "horse", "market", "song",
         "bridge", "doctor", "forest", "camera", "island", "kitchen", "painter", "train", "village")
POSITIVE = ("good", "bright", "lovely", "calm", "clever", "warm", "brave", "kind")
NEGATIVE = ("bad", "dark", "ugly", "noisy", "dull", "cold", "rude", "cruel")
FILLERS = ("very", "quite", "rather", "really", "so", "truly")
NLI_LABELS = ("contradiction", "neutral", "entailment")  # GLUE's MNLI label names, in MT-DNN's task-def order
LABEL_NOISE = 0.1
# The papers' numbers beside which the table is read (dev accuracy, %): MT-DNN Table 2 (BERT-large single task vs
# MT-DNN, GLUE dev) and MT-DNN-KD Table 2 (MT-DNN vs MT-DNN-KD, GLUE dev).
PAPER = {"rte": {"single_task": 70.1, "multi_task": 83.4}, "mnli": {"multi_task": 87.1, "distilled": 87.5}}


class Language:
    """Sentences of the artificial language and their two features: the nouns they mention and their polarity
    (+1 or -1, the sign of the sum of their adjectives' polarities, never 0)."""

    def __init__(self, rng):
        self.rng = rng

    def sentence(self, polarity=None, noun=None):
        noun = noun or self.rng.choice(NOUNS)
        while True:
            adjectives = list(self.rng.choice(POSITIVE + NEGATIVE, size=int(self.rng.choice([1, 3]))))
            score = sum(1 if a in POSITIVE else -1 for a in adjectives)
            if polarity is None or np.sign(score) == polarity:
                break
        words = ["the", noun, "is"]
        for index, adjective in enumerate(adjectives):
            if index:
                words.append("and" if index % 2 else "but")
            if self.rng.random() < 0.3:
                words.append(self.rng.choice(FILLERS))
            words.append(adjective)
        return " ".join(words) + " .", noun, int(np.sign(score))


def noisy(label, choices, rng, noise):
    """The label, or with probability `noise` another of `choices` (annotation noise in the training data)."""
    if rng.random() >= noise:
        return label
    return rng.choice([c for c in choices if c != label])


def write_tasks(folder: Path, sizes: dict, seed: int) -> dict:
    """The five tasks' train and dev TSV files in GLUE's layouts; returns {task: {split: path}}."""
    files = {}
    for task, (train_rows, dev_rows) in sizes.items():
        files[task] = {}
        for split, rows, noise in (("train", train_rows, LABEL_NOISE), ("dev", dev_rows, 0.0)):
            rng = np.random.default_rng([seed, list(sizes).index(task), split == "dev"])
            language = Language(rng)
            lines = WRITERS[task](language, rows, rng, noise)
            path = folder / task / f"{split}.tsv"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join("\t".join(map(str, line)) for line in lines) + "\n", encoding="utf-8")
            files[task][split] = path
    return files


def sst_rows(language, count, rng, noise):
    rows = [("sentence", "label")]
    for _ in range(count):
        text, _, polarity = language.sentence()
        rows.append((text, noisy(int(polarity > 0), (0, 1), rng, noise)))
    return rows


def mnli_rows(language, count, rng, noise):
    rows = [("index", "sentence1", "sentence2", "gold_label")]
    for index in range(count):
        premise, noun, polarity = language.sentence()
        label = rng.choice(NLI_LABELS)
        if label == "neutral":
            other = rng.choice([n for n in NOUNS if n != noun])
            hypothesis, _, _ = language.sentence(noun=other)
        else:
            hypothesis, _, _ = language.sentence(polarity if label == "entailment" else -polarity, noun)
        rows.append((index, premise, hypothesis, noisy(label, NLI_LABELS, rng, noise)))
    return rows


def stsb_rows(language, count, rng, noise):
    rows = [("index", "sentence1", "sentence2", "score")]
    for index in range(count):
        first, noun, polarity = language.sentence()
        same_noun = rng.random() < 0.5
        second, _, other = language.sentence(noun=noun if same_noun else None)
        score = 2.5 * (same_noun or second.split()[1] == noun) + 2.5 * (other == polarity)
        rows.append((index, first, second, f"{score:.1f}"))
    return rows


def qnli_rows(language, count, rng, noise):
    """Pairs of rows with one question: `is the <noun> good ?` (or `bad`), one candidate of the asked polarity
    (entailment), one of the other (not_entailment), in random order."""
    rows = [("index", "question", "sentence", "label")]
    for _ in range(count):
        noun = rng.choice(NOUNS)
        polarity = int(rng.choice([1, -1]))
        question = f"is the {noun} {'good' if polarity > 0 else 'bad'} ?"
        pair = [(language.sentence(polarity, noun)[0], "entailment"),
                (language.sentence(-polarity, noun)[0], "not_entailment")]
        for sentence, label in (pair if rng.random() < 0.5 else pair[::-1]):
            rows.append((len(rows) - 1, question, sentence, label))
    return rows


def rte_rows(language, count, rng, noise):
    """Two-way entailment about the premise's noun, as MNLI's without the neutral class and with one adjective in
    the hypothesis: entailed when the adjective has the premise's polarity (RTE and MNLI share their task, as in
    GLUE)."""
    rows = [("index", "sentence1", "sentence2", "label")]
    for index in range(count):
        premise, noun, polarity = language.sentence()
        agrees = rng.random() < 0.5
        adjective = rng.choice(POSITIVE if (polarity > 0) == agrees else NEGATIVE)
        label = "entailment" if agrees else "not_entailment"
        rows.append((index, premise, f"the {noun} seems {adjective} .",
                     noisy(label, ("not_entailment", "entailment"), rng, noise)))
    return rows


WRITERS = {"rte": rte_rows, "sst": sst_rows, "mnli": mnli_rows, "stsb": stsb_rows, "qnnli": qnli_rows}
TASK_DEFS = {
    "rte": {"task_type": "Classification", "n_class": 2, "data_format": "PremiseAndOneHypothesis",
            "labels": ["not_entailment", "entailment"], "metric_meta": ["ACC"], "dropout_p": 0.1},
    "sst": {"task_type": "Classification", "n_class": 2, "data_format": "PremiseOnly", "metric_meta": ["ACC"],
            "dropout_p": 0.1},
    "mnli": {"task_type": "Classification", "n_class": 3, "data_format": "PremiseAndOneHypothesis",
             "labels": list(NLI_LABELS), "enable_san": True, "metric_meta": ["ACC"], "dropout_p": 0.3},
    "stsb": {"task_type": "Regression", "n_class": 1, "data_format": "PremiseAndOneHypothesis",
             "metric_meta": ["Pearson", "Spearman"], "dropout_p": 0.1},
    "qnnli": {"task_type": "Ranking", "n_class": 1, "data_format": "PremiseAndMultiHypothesis",
              "metric_meta": ["ACC"], "dropout_p": 0.1},
}
CLASSIFICATION = ("rte", "sst", "mnli")
# rows (train, dev) of each task: a full run's, and --quick's
SIZES = {"rte": (300, 1000), "sst": (4000, 1000), "mnli": (4000, 1000), "stsb": (2000, 500), "qnnli": (2000, 500)}
QUICK_SIZES = {"rte": (40, 40), "sst": (60, 30), "mnli": (60, 30), "stsb": (40, 20), "qnnli": (30, 15)}
MAX_LENGTH = 64  # tokens of a row; the sentences are 5 to 15 tokens long
ENCODER_SIZES = {"num_hidden_layers": 2, "num_attention_heads": 4}  # intermediate size: twice the width
SAN = {"num_turns": 3}  # MNLI's head


def prepare_tasks(folder: Path, sizes: dict, seed: int) -> tuple[BertTokenizer, dict]:
    """Write the tasks under `folder`, train a WordPiece vocabulary on their training rows and tokenize them:
    returns the tokenizer and `{"train"|"dev": {task: dataset}}`."""
    files = write_tasks(folder / "data", sizes, seed)
    texts = [line for paths in files.values() for line in paths["train"].read_text().splitlines()]
    tokenizer = BertTokenizer(vocab=str(train_bert_vocab(texts, folder / "vocab", vocab_size=200)))
    config = MTDNNConfig.from_task_defs(TASK_DEFS, bert_config(tokenizer, 64), san=SAN)  # the tasks' specs
    data = {split: {task: load_glue_tsv(paths[split], config, task, tokenizer, max_length=MAX_LENGTH)
                    for task, paths in files.items()} for split in ("train", "dev")}
    print(f"seed {seed}: tasks: " + ", ".join(
        f"{task} {len(data['train'][task])} train / {len(data['dev'][task])} dev" for task in files), flush=True)
    return tokenizer, data


def bert_config(tokenizer, hidden: int) -> BertConfig:
    """The encoder: a small BERT of width `hidden` over the tokenizer's vocabulary."""
    return BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      max_position_embeddings=MAX_LENGTH, **ENCODER_SIZES)


def build_model(tokenizer, hidden: int, seed: int, encoder=None) -> MTDNNModel:
    """The five tasks' MT-DNN on `encoder` (a config over the tokenizer's vocabulary; by default `bert_config`),
    freshly initialised with `seed`."""
    config = MTDNNConfig.from_task_defs(TASK_DEFS, encoder or bert_config(tokenizer, hidden), san=SAN)
    torch.manual_seed(seed)
    return MTDNNModel(config)


def train(model, train_sets: dict, dev_sets: dict, steps: int, seed: int, scratch: Path, learning_rate: float,
          batch_size: int, kd_weight: float = 0.0, smart: SmartSettings | None = None) -> dict:
    """Multi-task training with the paper's recipe (and SMART with `smart`); returns the dev metrics of every task in
    `dev_sets`."""
    args = TrainingArguments(output_dir=str(scratch), max_steps=steps, per_device_train_batch_size=batch_size,
                             per_device_eval_batch_size=128, learning_rate=learning_rate, warmup_steps=0.1,
                             max_grad_norm=1.0, lr_scheduler_type="linear", logging_steps=max(1, steps // 5),
                             save_strategy="no", report_to=[], disable_tqdm=True, seed=seed, use_cpu=True)
    trainer = MTDNNTrainer(model=model, args=args, train_dataset=train_sets, eval_dataset=dev_sets or None,
                           optimizer_name="adamax", kd_loss="soft_ce", kd_weight=kd_weight, smart=smart)
    send_logs_to_stderr(trainer)
    trainer.train()
    if not dev_sets:
        return {}
    metrics = trainer.evaluate()
    return {task: {name.removeprefix(f"eval_{task}_"): value for name, value in metrics.items()
                   if name.startswith(f"eval_{task}_") and not name.endswith("_loss")} for task in dev_sets}


def parser():
    parser = reproduction_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2500, help="multi-task training steps (default 2500)")
    parser.add_argument("--teachers", type=int, default=2, help="models in the distillation ensemble (default 2)")
    return parser


def run(args) -> dict:
    """One seed: RTE alone, all five tasks, then fine-tuned on RTE; teachers and a distilled student."""
    if args.quick:
        sizes = QUICK_SIZES
        steps, fine_tune_steps, hidden, batch_size, teachers = 8, 4, 32, 8, 2
    else:
        sizes = SIZES
        steps, fine_tune_steps, hidden, batch_size, teachers = args.steps, args.steps // 5, 64, 32, args.teachers
    learning_rate = 1e-3

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        tokenizer, data = prepare_tasks(scratch, sizes, args.seed)
        config = build_model(tokenizer, hidden, args.seed).config

        print(f"seed {args.seed}: 1. single task: RTE alone", flush=True)
        single = train(build_model(tokenizer, hidden, args.seed), {"rte": data["train"]["rte"]},
                       {"rte": data["dev"]["rte"]}, steps, args.seed, scratch / "single", learning_rate, batch_size)
        print(f"seed {args.seed}: 2. multi-task: all five tasks", flush=True)
        multi_model = build_model(tokenizer, hidden, args.seed)
        multi = train(multi_model, data["train"], data["dev"], steps, args.seed, scratch / "multi", learning_rate,
                      batch_size)
        print(f"seed {args.seed}: 3. multi-task, then fine-tuned on RTE", flush=True)
        tuned = train(multi_model, {"rte": data["train"]["rte"]}, {"rte": data["dev"]["rte"]}, fine_tune_steps,
                      args.seed, scratch / "tuned", learning_rate, batch_size)
        # teacher seeds lie past every run's own seed, so that no teacher is another seed's multi-task model
        teacher_seeds = [1000 * number + args.seed for number in range(1, teachers + 1)]
        print(f"seed {args.seed}: 4. distillation: an ensemble of {teachers} multi-task teachers (seeds "
              f"{', '.join(map(str, teacher_seeds))}) -> student", flush=True)
        ensemble = []
        for number, teacher_seed in enumerate(teacher_seeds, start=1):
            teacher = build_model(tokenizer, hidden, teacher_seed)
            train(teacher, data["train"], {}, steps, teacher_seed, scratch / f"teacher{number}", learning_rate,
                  batch_size)
            ensemble.append(teacher)
        soft = {task: add_soft_labels(rows, ensemble, task) if task in CLASSIFICATION else rows
                for task, rows in data["train"].items()}
        ensemble_metrics = ensemble_dev_metrics(ensemble, data["dev"], config)
        student = train(build_model(tokenizer, hidden, args.seed), soft, data["dev"], steps, args.seed,
                        scratch / "student", learning_rate, batch_size, kd_weight=1.0)
    return {
        "data": {"source": "generated GLUE-shaped tasks (this script)", "sizes": sizes, "label_noise": LABEL_NOISE},
        "recipe": {"optimizer": "adamax", "learning_rate": learning_rate, "warmup": 0.1, "max_grad_norm": 1.0,
                   "steps": steps, "fine_tune_steps": fine_tune_steps, "batch_size": batch_size, "hidden": hidden},
        "tasks": list(sizes),
        "single_task": single, "multi_task": multi, "multi_task_fine_tuned": tuned,
        "distillation": {"teachers": teachers, "ensemble": ensemble_metrics, "student": student},
        "paper": PAPER,
    }


def accuracy(results: dict, read) -> str:
    """Dev accuracy in percent, mean ± standard deviation over the seeds; `read` picks a task's metrics."""
    return spread(values(results, lambda seed: read(seed)["accuracy"]), 1, scale=100)


KD_TASKS = CLASSIFICATION + ("qnnli",)


def claims() -> list[tuple[str, object]]:
    """The papers' claims as tests of one seed's figures."""
    def rte(seed, run):
        return seed[run]["rte"]["accuracy"]

    found = [("RTE: multi-task beats single task", lambda seed: rte(seed, "multi_task") > rte(seed, "single_task")),
             ("RTE: multi-task, then fine-tuned on RTE, beats multi-task alone",
              lambda seed: rte(seed, "multi_task_fine_tuned") > rte(seed, "multi_task"))]
    for task in KD_TASKS:
        found.append((f"{task}: the distilled student beats the hard-label multi-task model",
                      lambda seed, t=task: seed["distillation"]["student"][t]["accuracy"]
                      > seed["multi_task"][t]["accuracy"]))
    found.append(("mnli: the teachers' ensemble beats the hard-label multi-task model (what distillation passes on)",
                  lambda seed: seed["distillation"]["ensemble"]["mnli"]["accuracy"]
                  > seed["multi_task"]["mnli"]["accuracy"]))
    return found


def tables(results: dict) -> str:
    """RTE single task / multi-task / fine-tuned, and hard labels against distillation (dev accuracy, mean ±
    standard deviation over the seeds), then the papers' claims, seed by seed."""
    teachers = results["per_seed"][0]["distillation"]["teachers"]
    rows = [["single task", accuracy(results, lambda seed: seed["single_task"]["rte"]),
             f"{PAPER['rte']['single_task']} (BERT-large)"],
            ["multi-task", accuracy(results, lambda seed: seed["multi_task"]["rte"]), ""],
            ["multi-task, then fine-tuned on RTE", accuracy(results, lambda seed: seed["multi_task_fine_tuned"]["rte"]),
             f"{PAPER['rte']['multi_task']} (MT-DNN)"]]
    kd_rows = [[task, accuracy(results, lambda seed, t=task: seed["multi_task"][t]),
                accuracy(results, lambda seed, t=task: seed["distillation"]["ensemble"][t]),
                accuracy(results, lambda seed, t=task: seed["distillation"]["student"][t])] for task in KD_TASKS]
    claim_rows = [[claim, holds(results, test)] for claim, test in claims()]
    return "\n\n".join([
        markdown_table(["RTE dev accuracy (%)", "ours", "paper (MT-DNN Table 2, dev)"], rows),
        markdown_table(["dev accuracy (%)", "multi-task, hard labels", f"ensemble of {teachers} teachers",
                        "student, distilled"], kd_rows)
        + f"\n\npaper (MT-DNN-KD Table 2): MNLI {PAPER['mnli']['multi_task']} -> {PAPER['mnli']['distilled']}",
        markdown_table(["claim", "holds in (seeds)"], claim_rows)])


def draw(pyplot, results: dict, path) -> None:
    """RTE's three runs, and hard labels against the ensemble and the student on every task: means over the seeds,
    standard deviations as error bars."""
    def bar_values(read):
        scores = np.array(values(results, read)) * 100
        return scores.mean(), scores.std(ddof=1) if len(scores) > 1 else 0.0

    figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 3.8))
    runs = (("single task", "single_task"), ("multi-task", "multi_task"),
            ("multi-task\n+ fine-tuning", "multi_task_fine_tuned"))
    bars = [bar_values(lambda seed, r=run: seed[r]["rte"]["accuracy"]) for _, run in runs]
    left.bar([name for name, _ in runs], [m for m, _ in bars], yerr=[d for _, d in bars], capsize=3,
             color=["#999999", "#4c72b0", "#2a4d8f"])
    left.set_ylabel("RTE dev accuracy (%)")
    left.set_title("the small task gains from the others")
    left.set_ylim(40, 100)
    positions = np.arange(len(KD_TASKS))
    for offset, label, read in ((-0.27, "hard labels", lambda seed, t: seed["multi_task"][t]),
                                (0, "teacher ensemble", lambda seed, t: seed["distillation"]["ensemble"][t]),
                                (0.27, "distilled student", lambda seed, t: seed["distillation"]["student"][t])):
        bars = [bar_values(lambda seed, t=task, r=read: r(seed, t)["accuracy"]) for task in KD_TASKS]
        right.bar(positions + offset, [m for m, _ in bars], width=0.27, yerr=[d for _, d in bars], capsize=3,
                  label=label)
    right.set_xticks(positions, list(KD_TASKS))
    right.set_ylabel("dev accuracy (%)")
    right.set_ylim(40, 100)
    right.set_title("distillation from an ensemble")
    right.legend(loc="lower right")
    figure.suptitle(f"MT-DNN (mean over {len(results['seeds'])} seeds)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def ensemble_dev_metrics(models, dev_sets, config) -> dict:
    """Dev metrics of the ensemble's averaged prediction (the teachers' mean probabilities, as the soft targets)."""
    metrics = {}
    for task in CLASSIFICATION + ("qnnli",):
        spec = config.task(task)
        mean = np.array(teacher_soft_labels(models, dev_sets[task], task))
        outputs = (None, mean) if spec["type"] == "ranking" else mean  # ranking predictions read group scores
        metrics[task] = evaluate_task(spec, outputs, np.array(dev_sets[task]["labels"]))
    return metrics


if __name__ == "__main__":
    main(parser(), run, tables, draw)
