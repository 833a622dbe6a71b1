#!/usr/bin/env python
"""ERNIE 2.0 continual pre-training on a streamed corpus (`hf-ext ernie2 pretrain --streaming`): peak memory against
corpus size, and how fast examples are built against how fast the trainer consumes them.

The corpus is generated: documents of three paragraphs of four sentences drawn from the package's bundled sentences,
each document with its own capitalised name, in 8 JSON-lines shards, at 1x and 10x the number of documents.

(a) Peak resident memory (VmHWM of a fresh process) of a streamed run that reads its whole corpus once
    (capitalization, one example per paragraph; steps = examples / batch), at 1x and 10x: the 10x run must stay
    within 5% of the 1x run. With `--in-memory`, the same runs with the corpus read into memory first (the examples
    built map-style) are measured beside, for comparison.
(b) Examples built per second from the stream (knowledge masking, sentence distance and capitalization mixed as a
    stage mixes them; one process, the cores the trainer uses) against examples per second that a training step
    of an ERNIE 2.0 base-size model (12 layers, width 768) consumes from already built batches: building must be at
    least 2x consumption, so that data is not the bottleneck. A tiny model's consumption is shown for comparison.
(c) With `--larger-than-memory`: a corpus larger than the machine's physical memory (1.25x by default) is written,
    and the peak resident memory of a streamed run of the 1x run's steps over it is measured against the same run
    over a 1 GiB corpus built the same way (target: within 5%) and over the 1x corpus (shown). Reading such a corpus
    whole takes days on a CPU, so these runs read its beginning, as a pre-training of `--max-steps` over a large
    corpus does: what they show is that nothing loads, scans or indexes the corpus before or while training. The
    1 GiB corpus is the baseline because `datasets`' JSON reader holds one block of a shard (10 MB of text) at a
    time, which the 1x corpus's small shards never fill. Their documents are blocks of the generated documents
    written again under new names, so that the corpora are written at disk speed; it needs that much free disk.
"""

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
from timing import benchmark_parser, finish, measure_rounds, record, report_ratio, setup

from hf_ext.sample_text import bundled_sentences, train_bert_vocab

SHARDS = 8
BATCH = 64
MAX_LENGTH = 64
NAMES = ["Ada", "Marie", "Alan", "Grace", "Niels", "Emmy", "Carl", "Rosalind"]
STREAMED = ("from bench_ernie2_streaming import pretrain", "pretrain(sys.argv[1], sys.argv[2], int(sys.argv[3]), "
            "streaming=True)")
IN_MEMORY = ("from bench_ernie2_streaming import pretrain", "pretrain(sys.argv[1], sys.argv[2], int(sys.argv[3]), "
             "streaming=False)")


def write_corpus(folder: Path, documents: int, seed: int = 0) -> int:
    """`documents` generated documents in `SHARDS` JSON-lines shards; returns their bytes."""
    rng = random.Random(seed)
    sentences = bundled_sentences()
    folder.mkdir(parents=True)
    files = [(folder / f"shard-{i:02d}.jsonl").open("w", encoding="utf-8") for i in range(SHARDS)]
    for number in range(documents):
        name = f"{rng.choice(NAMES)} Number{number}"
        paragraphs = [[f"{name} saw that {rng.choice(sentences)}", *rng.sample(sentences, 3)] for _ in range(3)]
        files[number % SHARDS].write(json.dumps({"paragraphs": paragraphs}) + "\n")
    for file in files:
        file.close()
    return sum(path.stat().st_size for path in folder.iterdir())


def write_large_corpus(folder: Path, target_bytes: int, block_documents: int = 20000, seed: int = 0) -> dict:
    """At least `target_bytes` of documents in `SHARDS` shards: one block of generated documents, written again and
    again with each copy's documents renamed (`Number<copy>x<document>`), so that every document is distinct."""
    rng = random.Random(seed)
    sentences = bundled_sentences()
    lines = []
    for number in range(block_documents):
        name = f"{rng.choice(NAMES)} Number@COPY@x{number}"
        paragraphs = [[f"{name} saw that {rng.choice(sentences)}", *rng.sample(sentences, 3)] for _ in range(3)]
        lines.append(json.dumps({"paragraphs": paragraphs}) + "\n")
    block = "".join(lines)
    folder.mkdir(parents=True)
    files = [(folder / f"shard-{i:02d}.jsonl").open("w", encoding="utf-8") for i in range(SHARDS)]
    written = copies = 0
    while written < target_bytes:
        text = block.replace("@COPY@", str(copies))
        files[copies % SHARDS].write(text)
        written += len(text.encode("utf-8"))
        copies += 1
    for file in files:
        file.close()
    return {"documents": copies * block_documents, "bytes": sum(path.stat().st_size for path in folder.iterdir())}


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def tokenizer_folder(folder: Path) -> Path:
    from transformers import BertTokenizer

    train_bert_vocab(bundled_sentences(), folder, vocab_size=400)
    BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    return folder


def config(vocab_size: int, base: bool):
    from hf_ext.models.ernie2 import Ernie2PreTrainingConfig

    sizes = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072) if base \
        else dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    return Ernie2PreTrainingConfig(vocab_size=vocab_size, max_position_embeddings=MAX_LENGTH, **sizes)


def pretrain(corpus: str, tokenizer_dir: str, steps: int, streaming: bool) -> None:
    """A one-stage capitalization run of a tiny model over `corpus` (what `hf-ext ernie2 pretrain` does)."""
    from transformers import BertTokenizer

    from hf_ext.models.ernie2 import Ernie2ForPreTraining
    from hf_ext.models.ernie2.data import load_documents, pretraining_datasets, read_documents, task_streams
    from hf_ext.models.ernie2.schedule import ContinualSchedule
    from hf_ext.models.ernie2.training import continual_pretraining
    from hf_ext.trainer import training_arguments

    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    model_config = config(len(tokenizer), base=False)
    schedule = ContinualSchedule.from_dict({"stages": [{"steps": {"capitalization": steps}}]})
    if streaming:
        datasets = task_streams(tokenizer, model_config, schedule, read_documents(corpus, streaming=True),
                                max_length=MAX_LENGTH)
    else:
        documents = load_documents(corpus) if Path(corpus).is_file() else read_documents(corpus)
        datasets = pretraining_datasets(tokenizer, model_config, schedule, documents, max_length=MAX_LENGTH)
    with tempfile.TemporaryDirectory() as out:
        args = training_arguments(out, per_device_train_batch_size=BATCH, use_cpu=True, disable_tqdm=True,
                                  logging_steps=10**6)
        continual_pretraining(Ernie2ForPreTraining(model_config), schedule, datasets, args)


def build_rate(corpus: Path, tokenizer, examples: int) -> float:
    """Examples per second a stage's mixture of three tasks builds from the stream."""
    from hf_ext.models.ernie2.data import read_documents, stage_mixture, task_streams
    from hf_ext.models.ernie2.schedule import ContinualSchedule

    schedule = ContinualSchedule.from_dict({"stages": [
        {"steps": {"knowledge_masking": 2, "sentence_distance": 1, "capitalization": 1}}]})
    streams = task_streams(tokenizer, config(len(tokenizer), base=False), schedule,
                           read_documents(corpus, streaming=True), max_length=MAX_LENGTH)
    start = time.perf_counter()
    count = sum(1 for _ in stage_mixture(streams, schedule.stages[0]).take(examples))
    return count / (time.perf_counter() - start)


def consume_rate(tokenizer, batches: list, base: bool) -> float:
    """Examples per second of training steps (forward, backward, optimizer) on already built batches."""
    from hf_ext.models.ernie2 import Ernie2ForPreTraining

    torch.manual_seed(0)
    model = Ernie2ForPreTraining(config(len(tokenizer), base=base)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows = 0
    start = time.perf_counter()
    for batch in batches:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rows += batch["input_ids"].shape[0]
    return rows / (time.perf_counter() - start)


def training_batches(corpus: Path, tokenizer, count: int, size: int) -> list:
    from hf_ext.models.ernie2.data import Ernie2PreTrainingCollator, read_documents, stage_mixture, task_streams
    from hf_ext.models.ernie2.schedule import ContinualSchedule

    schedule = ContinualSchedule.from_dict({"stages": [
        {"steps": {"knowledge_masking": 2, "sentence_distance": 1, "capitalization": 1}}]})
    model_config = config(len(tokenizer), base=False)
    streams = task_streams(tokenizer, model_config, schedule, read_documents(corpus, streaming=True),
                           max_length=MAX_LENGTH)
    examples = list(stage_mixture(streams, schedule.stages[0]).take(count * size))
    collate = Ernie2PreTrainingCollator(model_config.task_ids)
    return [collate(examples[i * size:(i + 1) * size]) for i in range(count)]


def main(argv=None):
    from transformers import BertTokenizer

    parser = benchmark_parser(__doc__)
    parser.add_argument("--documents", type=int, default=2000, help="documents of the 1x corpus (default 2000)")
    parser.add_argument("--in-memory", action="store_true",
                        help="also measure the runs that read the corpus into memory first (for comparison)")
    parser.add_argument("--workdir", type=Path, help="where to write the corpora (default: a temporary folder)")
    parser.add_argument("--larger-than-memory", type=float, nargs="?", const=1.25, metavar="TIMES",
                        help="(c): also stream from a corpus TIMES the machine's physical memory (default 1.25; "
                             "needs that much free disk in --workdir)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=1)
    documents = 40 if args.quick else args.documents
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tokenizer_dir = tokenizer_folder(Path(tmp) / "tokenizer")
        tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
        sizes = {}
        for scale in (1, 10):
            folder = Path(tmp) / f"corpus-{scale}x"
            sizes[scale] = {"documents": scale * documents, "bytes": write_corpus(folder, scale * documents)}
            # capitalization gives one example per paragraph: the run reads its corpus once
            sizes[scale]["steps"] = -(-3 * scale * documents // BATCH)
        record("corpus", {f"{scale}x": size for scale, size in sizes.items()})
        print("corpora: " + "; ".join(f"{scale}x {size['documents']} documents, {size['bytes'] / 2**20:.1f} MiB, "
                                      f"{size['steps']} steps" for scale, size in sizes.items()))
        kinds = (("streamed", STREAMED), ("in memory", IN_MEMORY)) if args.in_memory else (("streamed", STREAMED),)
        candidates = {f"{kind} {scale}x": (*code, (Path(tmp) / f"corpus-{scale}x", tokenizer_dir,
                                                   sizes[scale]["steps"]))
                      for kind, code in kinds for scale in (1, 10)}
        runs = measure_rounds(candidates, repeats, warmup=0, section="(a) pre-training over the whole corpus")
        for name, measured in runs.items():
            seconds = ", ".join(f"{run['seconds']:.1f}" for run in measured)
            print(f"  {name}: seconds {seconds}; peak RSS "
                  + ", ".join(f"{run['peak'] / 2**20:.0f} MiB" for run in measured))
        report_ratio("(a) peak RSS of the streamed run, 10x corpus / 1x corpus",
                     [run["peak"] for run in runs["streamed 10x"]], [run["peak"] for run in runs["streamed 1x"]],
                     target=1.05)
        if args.in_memory:
            report_ratio("(for comparison) peak RSS of the in-memory run, 10x corpus / 1x corpus",
                         [run["peak"] for run in runs["in memory 10x"]],
                         [run["peak"] for run in runs["in memory 1x"]])

        corpus = Path(tmp) / "corpus-1x"
        steps, base_batch = (2, 4) if args.quick else (4, 16)
        base_batches = training_batches(corpus, tokenizer, steps + 1, base_batch)
        tiny_batches = training_batches(corpus, tokenizer, 4 * steps + 1, BATCH)
        built, base, tiny = [], [], []
        for _ in range(repeats):
            built.append(build_rate(corpus, tokenizer, 100 if args.quick else 4000))
            # the first step of each model is a warm-up
            base.append(consume_rate(tokenizer, base_batches, base=not args.quick))  # quick: no base-size model
            tiny.append(consume_rate(tokenizer, tiny_batches, base=False))
        record("examples_per_second", {"built": built, "consumed_base_model": base, "consumed_tiny_model": tiny})
        print(f"  examples/s built {', '.join(f'{r:.0f}' for r in built)}; consumed by the base-size model "
              f"{', '.join(f'{r:.1f}' for r in base)}; by the tiny model {', '.join(f'{r:.0f}' for r in tiny)}")
        report_ratio("(b) examples built per second / examples an ERNIE 2.0 base-size model trains on per second",
                     built, base, target=2, higher_is_better=True)
        report_ratio("(for comparison) examples built per second / examples the tiny model trains on per second",
                     built, tiny, higher_is_better=True)
        shutil.rmtree(Path(tmp) / "corpus-10x")
        if args.larger_than_memory:
            memory = physical_memory()
            # quick: token corpora, so that the path runs; the figures mean nothing then
            targets = {"1 GiB": 2**20 if args.quick else 2**30,
                       "larger than memory": 2**21 if args.quick else int(args.larger_than_memory * memory)}
            corpora, corpus_sizes = {}, {}
            for name, target in targets.items():
                corpora[name] = Path(tmp) / f"corpus-{name.replace(' ', '-')}"
                started = time.perf_counter()
                corpus_sizes[name] = write_large_corpus(corpora[name], target,
                                                        block_documents=100 if args.quick else 20000)
                print(f"  corpus {name}: {corpus_sizes[name]['bytes'] / 2**30:.2f} GiB, "
                      f"{corpus_sizes[name]['documents']} documents, written in {time.perf_counter() - started:.0f} s")
            print(f"  physical memory {memory / 2**30:.1f} GiB")
            record("larger_than_memory", {"physical_memory_bytes": memory, "steps": sizes[1]["steps"],
                                          "corpora": corpus_sizes})
            steps = sizes[1]["steps"]
            large_runs = measure_rounds(
                {"streamed 1x": (*STREAMED, (Path(tmp) / "corpus-1x", tokenizer_dir, steps)),
                 **{f"streamed, corpus {name}": (*STREAMED, (folder, tokenizer_dir, steps))
                    for name, folder in corpora.items()}},
                repeats, warmup=0, section="(c) the 1x run's steps over a corpus larger than memory")
            peaks = {name: [run["peak"] for run in measured] for name, measured in large_runs.items()}
            report_ratio("(c) peak RSS of the streamed run, corpus larger than memory / 1 GiB corpus, same steps",
                         peaks["streamed, corpus larger than memory"], peaks["streamed, corpus 1 GiB"], target=1.05)
            report_ratio("(for comparison) peak RSS, corpus larger than memory / 1x corpus, same steps",
                         peaks["streamed, corpus larger than memory"], peaks["streamed 1x"])
            for folder in corpora.values():
                shutil.rmtree(folder)
    finish()


if __name__ == "__main__":
    main()
