"""`hf-ext optimus demo` (or `hf-ext demo`): the whole Optimus path on material the package ships, with nothing to
download.

1. write an Optimus checkpoint in the original on-disk format (tokenizers trained on the bundled sentences, freshly
   initialised weights), 2. convert it, 3. lay the converted folder into a local Hub cache and load it back with
   `AutoModel.from_pretrained("hf-ext/optimus-demo")`, 4. train it with `Trainer` on the bundled sentences,
   5. reconstruct them, interpolate between two of them, decode prior samples and measure the latent space (KL,
   active units, mutual information), 6. write demo.json and, when matplotlib is there, demo.png (the latent space
   with the interpolation path, beside the training curves).

The model learns the 40 bundled sentences, beside 216 sentences recombined from parts of them (a subject, an
activity, a place), and is asked about the bundled ones: the demo shows the mechanics, not generalisation. The
recombined sentences teach it that a sentence is made of parts, so that the points between two sentences decode to
sentences that mix the parts of both.
"""

import argparse
import contextlib
import itertools
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ...arguments import positive_int
from ...cli_utils import add_device_arguments, training_device_settings

DEMO_REPO_ID = "hf-ext/optimus-demo"
MARKER = ".hf-ext-demo"
# The recipe, measured on the bundled sentences (docs/optimus.md, "The demo"): tokenizers whose vocabularies hold
# the sentences' words whole, so that a sentence is about ten decoder tokens; a small model; no dropout (the model
# is meant to learn these sentences); the original's schedule defaults (beta 0 for the first quarter of the run, an
# auto-encoder, a ramp to `BETA` over the second quarter, then `BETA` for the second half, long enough for the
# decoder to settle after the KL penalty reshapes the latent space), with free bits leaving the KL of each
# dimension up to `DIM_TARGET_KL` unpenalised.
MODEL_SIZES = dict(latent_size=16, hidden_size=64, num_layers=2, num_heads=4, decoder_vocab_size=600)
# The parts the recombined sentences are made of, all taken from the bundled sentences; each bundled sentence is
# trained BUNDLED_REPEATS times per pass over the recombined ones, so that it is learnt whole.
SUBJECTS = ("a man", "a woman", "a boy", "a girl", "a child", "an old man")
ACTIVITIES = ("playing a guitar", "reading a book", "eating an apple", "riding a horse", "riding a bicycle",
              "drinking coffee")
PLACES = ("on the street", "in the park", "in the kitchen", "on the beach", "at home", "on the train")
BUNDLED_REPEATS = 4
BETA = 0.5
RATIO_ZERO = 0.25
RATIO_INCREASE = 0.25
DIM_TARGET_KL = 3.0
LEARNING_RATE = 2e-3
WARMUP_STEPS = 20
BATCH_SIZE = 16
DEFAULT_STEPS = 5000
# sentences whose reconstructions are printed, and the two ends of the interpolation (indices into the bundled file)
SHOWN = (0, 1, 2, 3)
INTERPOLATION_ENDS = (0, 1)
INTERPOLATION_STEPS = 6
PRIOR_SAMPLES = 3
# posterior samples per sentence for the importance-weighted likelihood; KL, MI and AU do not depend on it
METRIC_SAMPLES = 10


def add_demo_command(subparsers: argparse._SubParsersAction) -> None:
    """The `demo` command, under `hf-ext optimus` and as the shortcut `hf-ext demo`."""
    parser = subparsers.add_parser("demo", help="run the Optimus demo end to end on bundled data",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("hf-ext-demo"),
                        help="folder for everything the demo writes (default ./hf-ext-demo, replaced on each run)")
    parser.add_argument("--max-steps", type=positive_int, default=DEFAULT_STEPS,
                        help=f"training steps (default {DEFAULT_STEPS})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    add_device_arguments(parser, training=True)
    parser.set_defaults(handler=run_demo)


def recombined_sentences() -> list[str]:
    """Every `SUBJECTS` x `ACTIVITIES` x `PLACES` sentence, in the bundled sentences' form."""
    return [f"{subject} is {activity} {place} ." for subject, activity, place in
            itertools.product(SUBJECTS, ACTIVITIES, PLACES)]


def sentence_parts(text: str) -> dict[str, str]:
    """The subject, activity and place of a sentence of the recombined form (those of its parts it has)."""
    parts = {}
    for name, choices in (("subject", SUBJECTS), ("activity", ACTIVITIES), ("place", PLACES)):
        found = [choice for choice in choices if f" {choice} " in f" {text} "]
        if found:
            parts[name] = max(found, key=len)  # "an old man" rather than "a man"
    return parts


def shared_parts(text: str, source: str, target: str) -> tuple[list[str], list[str]]:
    """The parts `text` has of `source` and of `target`, each only where the two ends differ."""
    parts, first, last = sentence_parts(text), sentence_parts(source), sentence_parts(target)
    differing = [name for name in parts if first.get(name) != last.get(name)]
    return ([parts[name] for name in differing if parts[name] == first.get(name)],
            [parts[name] for name in differing if parts[name] == last.get(name)])


class ProgressLines(TrainerCallback):
    """A short line at the first log after every `every` steps and at the end: the reconstruction loss and the plain
    KL of the last logging window, beta and the time since `started`."""

    def __init__(self, started, every):
        self.started = started
        self.every = every
        self.next_line = every

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        step = state.global_step
        if logs and "loss_rec" in logs and (step >= self.next_line or step == state.max_steps):
            self.next_line = (step // self.every + 1) * self.every
            print(f"   step {step:>4}/{state.max_steps}  reconstruction loss {logs['loss_rec']:6.2f}  "
                  f"KL {logs['kl']:5.1f}  beta {logs['beta']:.2f}  ({time.monotonic() - self.started:.0f} s)",
                  flush=True)


def run_demo(args: argparse.Namespace) -> None:
    import torch

    threads = torch.get_num_threads()
    # a model this small gains nothing from more threads, and on a busy machine loses much to their synchronisation
    torch.set_num_threads(1)
    try:
        _run_demo(args)
    finally:
        torch.set_num_threads(threads)


def dropout_probabilities(config: PretrainedConfig) -> list[str]:
    """The names of `config`'s dropout probabilities (BERT's `*_dropout_prob`, GPT-2's `*_pdrop`, ...): its float
    fields whose name says dropout."""
    return [name for name, value in config.to_dict().items()
            if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop"))]


def _run_demo(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModel, AutoProcessor

    from ...errors import HfExtError
    from ...hub import Evaluation, install_into_hub_cache, write_training_card
    from . import OptimusLatentSpace
    from .conversion import convert_optimus_checkpoint
    from .metrics import evaluate_optimus_lm, word_accuracy
    from .samples import bundled_sentences, write_sample_checkpoint
    from .training import finetune_optimus

    started = time.monotonic()
    device_settings = training_device_settings(args)
    workdir = args.workdir
    if workdir.exists():
        if not (workdir / MARKER).exists():
            raise HfExtError(f"{workdir} exists and was not written by hf-ext demo; choose another --workdir")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).touch()
    torch.manual_seed(args.seed)
    sentences = bundled_sentences()
    recombined = recombined_sentences()
    print(f"hf-ext demo: a small Optimus trained, then queried, on the {len(sentences)} sentences bundled with hf-ext\n"
          f"   (hf_ext/data/sentences.txt, with {len(recombined)} sentences recombined from their parts: it shows the "
          "mechanics,\n   not generalisation); nothing is downloaded")

    print(f"1. writing an original-format Optimus checkpoint to {workdir / 'original'}")
    write_sample_checkpoint(workdir / "original", seed=args.seed, weight_scale=None, beta=BETA,
                            dim_target_kl=DIM_TARGET_KL, length_weighted_loss=False, **MODEL_SIZES)
    print("   tokenizers trained on the bundled sentences, weights freshly initialised")
    print(f"2. converting it: hf-ext convert optimus {workdir / 'original'} {workdir / 'converted'}")
    convert_optimus_checkpoint(workdir / "original", workdir / "converted")

    hub_cache = workdir / "hub"
    install_into_hub_cache(workdir / "converted", DEMO_REPO_ID, hub_cache)
    print(f"3. loading AutoModel.from_pretrained({DEMO_REPO_ID!r}) from the local Hub cache {hub_cache}")
    config = AutoConfig.from_pretrained(DEMO_REPO_ID, cache_dir=hub_cache, local_files_only=True)
    # the model is meant to learn these sentences: nothing to regularise. In the configuration, so that the saved
    # model is the one trained (continuing from it trains the same model)
    for sub_config in (config.encoder, config.decoder):
        for name in dropout_probabilities(sub_config):
            setattr(sub_config, name, 0.0)
    model = AutoModel.from_pretrained(DEMO_REPO_ID, config=config, cache_dir=hub_cache, local_files_only=True)
    processor = AutoProcessor.from_pretrained(DEMO_REPO_ID, cache_dir=hub_cache, local_files_only=True)
    print(f"   {type(model).__name__}: {model.num_parameters():,} parameters, latent size {model.config.latent_size}")

    texts = sentences * BUNDLED_REPEATS + recombined
    random.Random(args.seed).shuffle(texts)
    print(f"4. training with Trainer for {args.max_steps} steps on the {len(sentences)} bundled sentences and the "
          f"{len(recombined)} recombined ones\n"
          f"   beta 0 for the first {RATIO_ZERO:.0%} of the steps, a ramp to {BETA} over the next "
          f"{RATIO_INCREASE:.0%}; free bits: {DIM_TARGET_KL} nats per latent dimension")
    trainer = finetune_optimus(model, processor, Dataset.from_dict({"text": texts}), workdir / "trainer",
                               max_steps=args.max_steps, batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE,
                               ratio_zero=RATIO_ZERO, ratio_increase=RATIO_INCREASE,
                               logging_steps=max(1, args.max_steps // 40),
                               warmup_steps=min(WARMUP_STEPS, args.max_steps // 10), seed=args.seed, print_logs=False,
                               disable_tqdm=True, callbacks=[ProgressLines(started, max(1, args.max_steps // 8))],
                               **device_settings)
    with contextlib.suppress(OSError):  # Trainer makes its working folder; the demo saves no checkpoint there
        (workdir / "trainer").rmdir()
    model.save_pretrained(workdir / "finetuned")
    processor.save_pretrained(workdir / "finetuned")

    space = OptimusLatentSpace(model, processor, max_new_tokens=24)
    outputs = space.reconstruct(sentences)
    accuracies = [word_accuracy(source, output) for source, output in zip(sentences, outputs, strict=True)]
    print("5. reconstructions (encode, then greedy decoding from the posterior mean), with their word accuracy:")
    for index in SHOWN:
        print(f"   {accuracies[index]:4.0%}  {sentences[index]}\n         -> {outputs[index]}")
    print(f"   all {len(sentences)}: mean word accuracy {sum(accuracies) / len(accuracies):.0%}, "
          f"{sum(a == 1 for a in accuracies)} exact, {len(set(outputs))} different outputs")

    source, target = (sentences[index] for index in INTERPOLATION_ENDS)
    means, _ = space.encode([source, target])
    path_latents = model.interpolate(means[0], means[1], INTERPOLATION_STEPS)
    steps = list(zip(torch.linspace(0, 1, INTERPOLATION_STEPS).tolist(), space.decode(path_latents), strict=True))
    print(f"   interpolation between the posterior means of sentences {INTERPOLATION_ENDS[0] + 1} and "
          f"{INTERPOLATION_ENDS[1] + 1} of the file,\n   with the parts (subject, activity, place) each step has "
          "of the first / of the last:")
    mixes = [shared_parts(text, source, target) for _, text in steps]
    for (weight, text), (from_source, from_target) in zip(steps, mixes, strict=True):
        print(f"   t={weight:.2f}  {text:<45} parts {len(from_source)} / {len(from_target)}")
    samples = space.sample(PRIOR_SAMPLES, generator=torch.Generator().manual_seed(args.seed))
    print("   decoded from z ~ N(0, I):")
    for text in samples:
        print(f"   {text}")

    metrics = evaluate_optimus_lm(model, processor, sentences, num_samples=METRIC_SAMPLES,
                                  samples_per_pass=METRIC_SAMPLES,
                                  generator=torch.Generator().manual_seed(args.seed))
    print(f"   latent space over the {len(sentences)} sentences: KL {metrics['kl']:.1f} nats, active units "
          f"{metrics['active_units']}/{model.config.latent_size}, mutual information {metrics['mi']:.2f} nats "
          "(hf_ext.models.optimus.metrics)")
    measured = {"word_accuracy": sum(accuracies) / len(accuracies),
                "exact_reconstructions": sum(a == 1 for a in accuracies) / len(accuracies), "kl": metrics["kl"],
                "active_units": metrics["active_units"], "mutual_information": metrics["mi"],
                "perplexity": metrics["perplexity"]}
    write_training_card(workdir / "finetuned", workdir / "finetuned", args, "hf-ext demo", None,
                        trainer.state.log_history,
                        [Evaluation("text-generation", f"the {len(sentences)} bundled sentences (its training data)",
                                    measured)])

    summary = {
        "trained_on": f"the {len(sentences)} bundled sentences (hf_ext/data/sentences.txt) and {len(recombined)} "
                      "recombined from their parts; the reconstructions are of training sentences",
        "max_steps": args.max_steps,
        "seed": args.seed,
        "reconstructions": [{"input": sentence, "output": output, "word_accuracy": accuracy}
                            for sentence, output, accuracy in zip(sentences, outputs, accuracies, strict=True)],
        "interpolation": {"source": source, "target": target,
                          "steps": [{"t": weight, "text": text, "parts_from_source": from_source,
                                     "parts_from_target": from_target}
                                    for (weight, text), (from_source, from_target) in zip(steps, mixes, strict=True)]},
        "prior_samples": samples,
        "kl": metrics["kl"],
        "active_units": metrics["active_units"],
        "latent_size": model.config.latent_size,
        "mutual_information": metrics["mi"],
        "reconstruction_nll": metrics["reconstruction_nll"],
        "perplexity": metrics["perplexity"],
        "importance_samples": METRIC_SAMPLES,
        "training_log": [entry for entry in trainer.state.log_history if "loss_rec" in entry],
    }
    print(f"6. writing {workdir / 'demo.json'}", end="")
    try:
        from .plots import plot_latent_space

        plotted = sentences + recombined
        all_means, _ = space.encode(plotted)
        # the shown sentences, and those the interpolation passes through
        passed = {index for index, sentence in enumerate(plotted) if sentence in dict(steps).values()}
        labelled = sorted({*SHOWN, *INTERPOLATION_ENDS} | passed)
        # from the device Trainer trained on
        plot_latent_space(all_means.cpu().numpy(), plotted, workdir / "demo.png",
                          interpolation=(path_latents.cpu().numpy(), steps), labelled=labelled,
                          log_history=trainer.state.log_history, title="hf-ext demo: Optimus on the bundled sentences")
        print(f" and {workdir / 'demo.png'} (the latent space and the training curves)")
    except HfExtError as missing_matplotlib:
        print(f" (no picture: {missing_matplotlib})")
    summary["seconds"] = round(time.monotonic() - started, 1)
    (workdir / "demo.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"done in {summary['seconds']:.0f} s: the trained model is in {workdir / 'finetuned'}")
