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

About 12 minutes on a loaded 2-core machine:

    python reproductions/mtdnn_multitask.py --output mtdnn.json --plot mtdnn.png
"""

import tempfile
from pathlib import Path

import numpy as np
import torch
from common import finish, markdown_table, plotting, reproduction_parser, start
from transformers import BertConfig, BertTokenizer, TrainingArguments

from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel
from hf_ext.models.mtdnn.data import load_glue_tsv
from hf_ext.models.mtdnn.distillation import add_soft_labels, teacher_soft_labels
from hf_ext.models.mtdnn.training import MTDNNTrainer, evaluate_task
from hf_ext.sample_text import train_bert_vocab
from hf_ext.trainer import send_logs_to_stderr

RESULT_KEYS = ["tasks", "single_task", "multi_task", "multi_task_fine_tuned", "distillation", "paper"]

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


def build_model(tokenizer, hidden: int, seed: int) -> MTDNNModel:
    encoder = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=2 * hidden, max_position_embeddings=64)
    config = MTDNNConfig.from_task_defs(TASK_DEFS, encoder, san={"num_turns": 3})
    torch.manual_seed(seed)
    return MTDNNModel(config)


def train(model, train_sets: dict, dev_sets: dict, steps: int, seed: int, scratch: Path, learning_rate: float,
          batch_size: int, kd_weight: float = 0.0) -> dict:
    """Multi-task training with the paper's recipe; returns the dev metrics of every task in `dev_sets`."""
    args = TrainingArguments(output_dir=str(scratch), max_steps=steps, per_device_train_batch_size=batch_size,
                             per_device_eval_batch_size=128, learning_rate=learning_rate, warmup_steps=0.1,
                             max_grad_norm=1.0, lr_scheduler_type="linear", logging_steps=max(1, steps // 5),
                             save_strategy="no", report_to=[], disable_tqdm=True, seed=seed, use_cpu=True)
    trainer = MTDNNTrainer(model=model, args=args, train_dataset=train_sets, eval_dataset=dev_sets or None,
                           optimizer_name="adamax", kd_loss="soft_ce", kd_weight=kd_weight)
    send_logs_to_stderr(trainer)
    trainer.train()
    if not dev_sets:
        return {}
    metrics = trainer.evaluate()
    return {task: {name.removeprefix(f"eval_{task}_"): value for name, value in metrics.items()
                   if name.startswith(f"eval_{task}_") and not name.endswith("_loss")} for task in dev_sets}


def main(argv=None):
    parser = reproduction_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2500, help="multi-task training steps (default 2500)")
    parser.add_argument("--teachers", type=int, default=2, help="models in the distillation ensemble (default 2)")
    args = parser.parse_args(argv)
    started = start(args)
    if args.quick:
        sizes = {"rte": (40, 40), "sst": (60, 30), "mnli": (60, 30), "stsb": (40, 20), "qnnli": (30, 15)}
        steps, fine_tune_steps, hidden, batch_size, teachers = 8, 4, 32, 8, 2
    else:
        sizes = {"rte": (300, 1000), "sst": (4000, 1000), "mnli": (4000, 1000), "stsb": (2000, 500),
                 "qnnli": (2000, 500)}
        steps, fine_tune_steps, hidden, batch_size, teachers = args.steps, args.steps // 5, 64, 32, args.teachers
    learning_rate = 1e-3

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        files = write_tasks(scratch / "data", sizes, args.seed)
        texts = [line for paths in files.values() for line in paths["train"].read_text().splitlines()]
        tokenizer = BertTokenizer(vocab=str(train_bert_vocab(texts, scratch / "vocab", vocab_size=200)))
        config = build_model(tokenizer, hidden, args.seed).config
        data = {split: {task: load_glue_tsv(paths[split], config, task, tokenizer, max_length=64)
                        for task, paths in files.items()} for split in ("train", "dev")}
        print("tasks: " + ", ".join(f"{task} {len(data['train'][task])} train / {len(data['dev'][task])} dev"
                                    for task in files), flush=True)

        print("1. single task: RTE alone", flush=True)
        single = train(build_model(tokenizer, hidden, args.seed), {"rte": data["train"]["rte"]},
                       {"rte": data["dev"]["rte"]}, steps, args.seed, scratch / "single", learning_rate, batch_size)
        print("2. multi-task: all five tasks", flush=True)
        multi_model = build_model(tokenizer, hidden, args.seed)
        multi = train(multi_model, data["train"], data["dev"], steps, args.seed, scratch / "multi", learning_rate,
                      batch_size)
        print("3. multi-task, then fine-tuned on RTE", flush=True)
        tuned = train(multi_model, {"rte": data["train"]["rte"]}, {"rte": data["dev"]["rte"]}, fine_tune_steps,
                      args.seed, scratch / "tuned", learning_rate, batch_size)
        print(f"4. distillation: an ensemble of {teachers} multi-task teachers (seeds {args.seed + 1}..) -> student",
              flush=True)
        ensemble = []
        for number in range(1, teachers + 1):
            teacher = build_model(tokenizer, hidden, args.seed + number)
            train(teacher, data["train"], {}, steps, args.seed + number, scratch / f"teacher{number}",
                  learning_rate, batch_size)
            ensemble.append(teacher)
        soft = {task: add_soft_labels(rows, ensemble, task) if task in CLASSIFICATION else rows
                for task, rows in data["train"].items()}
        ensemble_metrics = ensemble_dev_metrics(ensemble, data["dev"], config)
        student = train(build_model(tokenizer, hidden, args.seed), soft, data["dev"], steps, args.seed,
                        scratch / "student", learning_rate, batch_size, kd_weight=1.0)

    def accuracy(metrics, task):
        return 100 * metrics[task]["accuracy"]

    rows = [["RTE, single task", accuracy(single, "rte"), PAPER["rte"]["single_task"]],
            ["RTE, multi-task", accuracy(multi, "rte"), PAPER["rte"]["multi_task"]],
            ["RTE, multi-task + fine-tuning", accuracy(tuned, "rte"), PAPER["rte"]["multi_task"]]]
    print("\ndev accuracy (%) of the small task, RTE (paper: MT-DNN Table 2, BERT-large vs MT-DNN)\n")
    print(markdown_table(["model", "ours", "paper"], rows))
    kd_rows = [[task, accuracy(multi, task), accuracy(ensemble_metrics, task), accuracy(student, task)]
               for task in CLASSIFICATION] + [["qnnli (ranking)", accuracy(multi, "qnnli"),
                                               accuracy(ensemble_metrics, "qnnli"), accuracy(student, "qnnli")]]
    print("\ndev accuracy (%): hard labels vs distillation from the ensemble (paper: MT-DNN-KD Table 2, MNLI "
          f"{PAPER['mnli']['multi_task']} -> {PAPER['mnli']['distilled']})\n")
    print(markdown_table(["task", "multi-task, hard labels", f"ensemble of {teachers}", "student, distilled"],
                         kd_rows))

    pyplot = plotting(args)
    if pyplot is not None:
        figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 3.8))
        names = ["single task", "multi-task", "multi-task\n+ fine-tuning"]
        left.bar(names, [row[1] for row in rows], color=["#999999", "#4c72b0", "#2a4d8f"])
        left.set_ylabel("RTE dev accuracy (%)")
        left.set_title("the small task gains from the others")
        left.set_ylim(40, 100)
        positions = np.arange(len(kd_rows))
        for offset, column, label in ((-0.27, 1, "hard labels"), (0, 2, "teacher ensemble"),
                                      (0.27, 3, "distilled student")):
            right.bar(positions + offset, [row[column] for row in kd_rows], width=0.27, label=label)
        right.set_xticks(positions, [row[0] for row in kd_rows])
        right.set_ylabel("dev accuracy (%)")
        right.set_ylim(40, 100)
        right.set_title("distillation from an ensemble")
        right.legend(loc="lower right")
        figure.tight_layout()
        figure.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")

    finish(args, started, {
        "data": {"source": "generated GLUE-shaped tasks (this script)", "sizes": sizes, "label_noise": LABEL_NOISE},
        "recipe": {"optimizer": "adamax", "learning_rate": learning_rate, "warmup": 0.1, "max_grad_norm": 1.0,
                   "steps": steps, "fine_tune_steps": fine_tune_steps, "batch_size": batch_size, "hidden": hidden},
        "tasks": list(files),
        "single_task": single, "multi_task": multi, "multi_task_fine_tuned": tuned,
        "distillation": {"teachers": teachers, "ensemble": ensemble_metrics, "student": student},
        "paper": PAPER,
    })


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
    main()
