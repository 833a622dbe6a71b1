"""ERNIE 2.0's continual multi-task learning (Sun et al., AAAI 2020, section 3 and Figure 1): tasks are added stage
by stage; the continual scheme keeps training every earlier task with the new one, the sequential scheme trains
only the new task in each stage. The paper's claim: continual training does not forget what the first stages
learned. Measured here as each task's loss on held-out documents after every stage, for both schemes, with the
same per-task budget.

Corpus: the docstrings of Python's standard library (real English prose, cased, with paragraphs, installed with
every Python), one document per module; a tenth of the modules are held out for evaluation. Model: a small ERNIE
(`Ernie2ForPreTraining`) trained from scratch with `continual_pretraining`, the package's staged Trainer.

About 7 minutes of CPU time per seed, one thread:

    python reproductions/ernie2_continual.py --jobs 2 --threads 1 --output ernie2.json --plot ernie2.png
"""

import importlib
import inspect
import re
import tempfile
import warnings
from pathlib import Path

import torch
from common import holds, main, markdown_table, reproduction_parser, spread, values
from transformers import BertTokenizer, TrainingArguments

from hf_ext.models.ernie2 import Ernie2ForPreTraining, Ernie2PreTrainingConfig
from hf_ext.models.ernie2.data import Ernie2DataBuilder, Ernie2PreTrainingCollator, documents_from_records
from hf_ext.models.ernie2.schedule import PAPER_SCHEDULE, ContinualSchedule
from hf_ext.models.ernie2.training import continual_pretraining
from hf_ext.sample_text import train_bert_vocab

RESULT_KEYS = ["corpus", "schemes", "tasks", "held_out_loss", "forgetting"]  # of each seed

# Modules whose docstrings are long English prose; any that an interpreter lacks is skipped (the JSON lists those used).
MODULES = (
    "argparse", "asyncio", "calendar", "collections", "concurrent.futures", "configparser", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fnmatch", "fractions",
    "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html.parser", "http.client",
    "http.cookiejar", "http.server", "imaplib", "inspect", "ipaddress", "json", "locale", "logging",
    "logging.handlers", "lzma", "mailbox", "mimetypes", "numbers", "optparse", "pathlib", "pickle", "pickletools",
    "pkgutil", "platform", "poplib", "pprint", "queue", "random", "sched", "secrets", "selectors", "shelve", "shlex",
    "shutil", "smtplib", "socket", "socketserver", "ssl", "statistics", "string", "subprocess", "tarfile",
    "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback", "typing", "unittest.case",
    "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "zipfile",
)
HELD_OUT_EVERY = 10  # every tenth module (in the order above) is evaluation data
TASKS = ("knowledge_masking", "capitalization", "token_document_relation", "sentence_reordering")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def prose_sentences(paragraph: str) -> list[str]:
    """The sentences of a docstring paragraph that read as prose (no code, tables or signatures)."""
    if ">>>" in paragraph or "::" in paragraph or paragraph.lstrip().startswith(("-", "*", "|", ":")):
        return []
    text = " ".join(line.strip() for line in paragraph.splitlines())
    sentences = []
    for sentence in SENTENCE_END.split(text):
        words = sentence.split()
        letters = sum(ch.isalpha() for ch in sentence)
        if 5 <= len(words) <= 40 and letters > 0.7 * len(sentence.replace(" ", "")) and sentence[-1] in ".!?":
            sentences.append(sentence)
    return sentences


def module_document(name: str) -> list[list[str]]:
    """One document: the prose paragraphs of a module's docstring and of its public classes, functions and methods."""
    module = importlib.import_module(name)
    docstrings = [inspect.getdoc(module)]
    for attribute, value in sorted(vars(module).items()):
        if attribute.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        docstrings.append(inspect.getdoc(value))
        if inspect.isclass(value):
            docstrings += [inspect.getdoc(member) for key, member in sorted(vars(value).items())
                           if not key.startswith("_") and callable(member)]
    paragraphs = []
    for docstring in filter(None, docstrings):
        for block in re.split(r"\n\s*\n", docstring):
            sentences = prose_sentences(block)
            if sentences:
                paragraphs.append(sentences)
    return paragraphs


def stdlib_corpus(limit: int | None = None) -> tuple[list[dict], list[str]]:
    """`{"paragraphs": ...}` records, one per module with at least two paragraphs, and the modules used."""
    records, used = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules announce themselves on import
        for name in MODULES[:limit]:
            try:
                paragraphs = module_document(name)
            except ImportError:
                continue
            if len(paragraphs) >= 2:
                records.append({"paragraphs": paragraphs})
                used.append(name)
    return records, used


def schedules(steps_per_task: int) -> dict[str, ContinualSchedule]:
    """The paper's continual scheme (each task's budget spread over the stages as in `PAPER_SCHEDULE`, where every
    task has 50k steps) and the sequential one (each stage: its new task only, the whole budget), both scaled so
    that every task gets `steps_per_task` steps."""
    scale = steps_per_task / 50000
    continual = {"stages": [{"name": stage.name, "steps": {task: max(1, round(steps * scale))
                                                           for task, steps in stage.steps.items()}}
                            for stage in PAPER_SCHEDULE.stages]}
    sequential = {"stages": [{"name": f"stage {i + 1}", "steps": {task: steps_per_task}}
                             for i, task in enumerate(TASKS)]}
    return {name: ContinualSchedule.from_dict(value) for name, value in
            (("continual", continual), ("sequential", sequential))}


@torch.no_grad()
def held_out_loss(model, datasets, collator, batch_size: int) -> dict[str, float]:
    """Each task's mean loss over its held-out examples (batches of one task, as in training)."""
    model.eval()
    losses = {}
    for task in TASKS:
        rows, total, count = datasets[task], 0.0, 0
        for begin in range(0, len(rows), batch_size):
            features = [rows[i] for i in range(begin, min(begin + batch_size, len(rows)))]
            total += model(**collator(features))[f"{task}_loss"].item() * len(features)
            count += len(features)
        losses[task] = total / count
    return losses


def parser():
    parser = reproduction_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--steps-per-task", type=int, default=400, help="optimizer steps of each task (default 400)")
    return parser


def run(args) -> dict:
    """One seed: the same fresh model trained with both schemes, each task's held-out loss after every stage."""
    steps, batch_size, hidden, vocab = (6, 8, 32, 300) if args.quick else (args.steps_per_task, 32, 128, 2000)
    records, modules = stdlib_corpus(limit=12 if args.quick else None)
    train_records = [r for i, r in enumerate(records) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    eval_records = [r for i, r in enumerate(records) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    sentences = [s for record in train_records for paragraph in record["paragraphs"] for s in paragraph]
    print(f"seed {args.seed}: corpus: {len(modules)} standard-library modules, {len(sentences)} training sentences, "
          f"{len(eval_records)} held-out documents", flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = BertTokenizer(vocab=str(train_bert_vocab(sentences, Path(scratch) / "vocab", vocab_size=vocab)),
                                  do_lower_case=True)
        builder = Ernie2DataBuilder(tokenizer, max_length=64, seed=args.seed)
        train = builder.build(documents_from_records(train_records), TASKS)
        held_out = builder.build(documents_from_records(eval_records), TASKS)
        config = Ernie2PreTrainingConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=4 * hidden,
                                         max_position_embeddings=64)
        collator = Ernie2PreTrainingCollator(config.task_ids, tokenizer.pad_token_id)
        results = {}
        for scheme, schedule in schedules(steps).items():
            torch.manual_seed(args.seed)
            model = Ernie2ForPreTraining(config)
            out = Path(scratch) / scheme
            training = TrainingArguments(output_dir=str(out), per_device_train_batch_size=batch_size,
                                         learning_rate=1e-3, warmup_steps=0, save_strategy="no", report_to=[],
                                         logging_steps=max(1, steps // 4), seed=args.seed, use_cpu=True,
                                         disable_tqdm=True)
            print(f"seed {args.seed}: {scheme}: {len(schedule.stages)} stages, "
                  + "; ".join(", ".join(f"{t} {n}" for t, n in stage.steps.items()) for stage in schedule.stages),
                  flush=True)
            continual_pretraining(model, schedule, train, training, data_collator=collator, log_to_stderr=True)
            results[scheme] = []
            for index in range(len(schedule.stages)):
                stage_model = Ernie2ForPreTraining.from_pretrained(out / f"stage-{index + 1}" / "model")
                results[scheme].append(held_out_loss(stage_model, held_out, collator, 64))
                print(f"seed {args.seed}: {scheme}, after stage {index + 1}: " + ", ".join(
                    f"{t} {v:.3f}" for t, v in results[scheme][-1].items()), flush=True)

    # forgetting: how much a task's held-out loss rose from the end of the stage that introduces it (in the
    # sequential scheme, the stage that trains it last) to the end of the run
    forgetting = {scheme: {task: losses[-1][task] - losses[TASKS.index(task)][task] for task in TASKS[:-1]}
                  for scheme, losses in results.items()}
    return {
        "corpus": {"source": "Python standard library docstrings", "modules": modules,
                   "held_out_every": HELD_OUT_EVERY, "training_sentences": len(sentences)},
        "model": {"hidden_size": hidden, "layers": 2, "vocab_size": len(tokenizer)},
        "steps_per_task": steps,
        "schemes": {name: schedule.to_dict() for name, schedule in schedules(steps).items()},
        "tasks": list(TASKS),
        "held_out_loss": results,
        "forgetting": forgetting,
    }


# a rise of a held-out loss smaller than this is noise, not forgetting
FORGETTING_MARGIN = 0.05


def claims() -> list[tuple[str, object]]:
    """The paper's claim, task by task, as tests of one seed's figures."""
    found = []
    for task in TASKS[:-1]:
        found.append((f"continual: {task} is not forgotten (its held-out loss rises by less than "
                      f"{FORGETTING_MARGIN} after its stage)",
                      lambda seed, t=task: seed["forgetting"]["continual"][t] < FORGETTING_MARGIN))
        found.append((f"sequential: {task} is forgotten (its held-out loss rises by more than {FORGETTING_MARGIN})",
                      lambda seed, t=task: seed["forgetting"]["sequential"][t] > FORGETTING_MARGIN))
        found.append((f"{task} ends lower under the continual scheme than under the sequential one",
                      lambda seed, t=task: seed["held_out_loss"]["continual"][-1][t]
                      < seed["held_out_loss"]["sequential"][-1][t]))
    return found


def tables(results: dict) -> str:
    """Each task's held-out loss at the end of its stage and after the last (mean ± standard deviation over the
    seeds), and the paper's claim, seed by seed."""
    def loss(scheme, stage, task):
        return spread(values(results, lambda seed: seed["held_out_loss"][scheme][stage][task]), 3)

    rows = [[task, loss("continual", TASKS.index(task), task), loss("continual", -1, task),
             loss("sequential", TASKS.index(task), task), loss("sequential", -1, task)] for task in TASKS]
    figures = markdown_table(["task", "continual, end of its stage", "continual, after the last stage",
                              "sequential, end of its stage", "sequential, after the last stage"], rows)
    claim_rows = [[claim, holds(results, test)] for claim, test in claims()]
    return figures + "\n\n" + markdown_table(["claim", "holds in (seeds)"], claim_rows)


def draw(pyplot, results: dict, path) -> None:
    """Each task's held-out loss after every stage, both schemes: the mean over the seeds, the standard deviation as
    error bars."""
    stages = range(1, len(TASKS) + 1)
    figure, axes = pyplot.subplots(1, len(TASKS), figsize=(4 * len(TASKS), 3.4))
    for axis, task in zip(axes, TASKS, strict=True):
        for scheme, style in (("continual", "-o"), ("sequential", "--s")):
            losses = torch.tensor([values(results, lambda seed, s=scheme, i=i, t=task: seed["held_out_loss"][s][i][t])
                                   for i in range(len(TASKS))])
            deviations = losses.std(1) if losses.shape[1] > 1 else torch.zeros(len(TASKS))
            axis.errorbar(list(stages), losses.mean(1).tolist(), yerr=deviations.tolist(), fmt=style, capsize=3,
                          label=scheme)
        axis.axvline(TASKS.index(task) + 1, color="grey", lw=0.8, ls=":")
        axis.set_title(task.replace("_", " "))
        axis.set_xlabel("after stage")
        axis.set_xticks(list(stages))
    axes[0].set_ylabel("held-out loss")
    axes[0].legend()
    figure.suptitle("ERNIE 2.0: continual vs sequential multi-task learning (dotted: the task's first stage; "
                    f"mean over {len(results['seeds'])} seeds)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main(parser(), run, tables, draw)
