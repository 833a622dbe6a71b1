"""Guided generation and editing in Optimus' latent space (issue 31; the paper's Section 5.3 by the method of
LatentOps, Liu et al., EMNLP 2023): attribute classifiers on the latent of a frozen model, trained from at most 20
labelled sentences per class, steer an ODE sampler and an editor (`hf_ext.models.optimus.attributes`, method
`flow`); beside them, on the same models and operators, the label Gaussians fitted to the same sentences (method
`gaussian`: sampling from the requested labels' Gaussian, editing by the difference of label means); and the Optimus
paper's own label-conditional generation as its released code does it (method `conditional`,
`hf_ext.models.optimus.conditional`): a copy of the model fine-tuned whole on the same labelled sentences with a
learned embedding per label added to z, sampling a z plus the requested labels' embeddings, editing by adding the
target's embedding to a sentence's z.

Model: the demo's sizes, schedule and optimiser (`hf_ext/models/optimus/demo.py`, with `optimus_decoders.py`'s GPT-2
set-up and tokenizers) on this task's data: the 216 sentences recombined from the bundled sentences' parts (subject,
activity, place) but 36 held-out combinations (`held_out`), 2,000 steps, the posterior reading the encoder's mean
token state (`ENCODER_POOLING`: with the demo's BERT pooler, a model of the same data kept the place in 0.28 of its
reconstructions, seed 0 at 5,000 steps). Attributes: the three parts, so that every decoded sentence can be parsed
back (`demo.sentence_parts`): a sentence is well-formed when it is exactly "SUBJECT is ACTIVITY PLACE ." with known
parts. Operators: one per part, trained on 20 sentences per label of those the model trained on. Measured, per seed:

- guided sampling, one attribute, by each method: every label of every part, `SAMPLES_PER_LABEL` samples each: the
  share whose parsed part is the requested one, beside the same count drawn from the flow's starting distribution
  without guidance; the share well-formed; the share of distinct outputs; seconds per 100 samples (latents and
  decoding);
- two attributes combined: `PAIR_REQUESTS` random label pairs of each two parts, the share matching both;
- editing, by each method (and the `gaussian` one with `keep_others`, the move off the other parts' directions):
  `EDITS` random (recombined sentence, part, other label) requests: the share whose output has the target label and
  keeps the other two parts (and of the edits of held-out sentences), and beside it the reconstruction's own share
  keeping each part, of all 216 sentences and of the 36 held out (what the latent carries: an edit cannot keep what
  the model does not encode);
- the latent map of seed 0: posterior means on a plane, the subject operator's regions and one edit's path by the
  flow and by the `gaussian` method (the `conditional` one edits in its own fine-tuned model's latent space).

    python reproductions/optimus_guided.py --jobs 2 --threads 1 \\
        --output reproductions/results/optimus_guided.json --plot docs/images/optimus_guided.png

`--models DIR` keeps each seed's trained model in DIR/seed-N (with its training time) and a later run with the same
DIR measures those models instead of training them again (the recipe and seed are the same; the results say so).
"""

import copy
import itertools
import json
import random
import tempfile
import time
from pathlib import Path

import torch
from common import holds, main, markdown_table, reproduction_parser, spread, values
from datasets import Dataset
from optimus_decoders import build_processor, optimus_config

from hf_ext.models.optimus import OptimusLatentSpace, OptimusModel, OptimusProcessor
from hf_ext.models.optimus.attributes import (
    CONDITIONAL,
    GAUSSIAN_TEMPERATURE,
    LABEL_SHRINKAGE,
    METHODS,
    arithmetic_edited_latents,
    edited_latents,
    latent_base,
    train_latent_attribute,
)
from hf_ext.models.optimus.conditional import LEARNING_RATE as CONDITIONAL_LEARNING_RATE
from hf_ext.models.optimus.conditional import STEPS as CONDITIONAL_STEPS
from hf_ext.models.optimus.conditional import train_label_conditional
from hf_ext.models.optimus.demo import (
    ACTIVITIES,
    BATCH_SIZE,
    LEARNING_RATE,
    PLACES,
    RATIO_INCREASE,
    RATIO_ZERO,
    SUBJECTS,
    WARMUP_STEPS,
    recombined_sentences,
    sentence_parts,
)
from hf_ext.models.optimus.training import finetune_optimus

RESULT_KEYS = ["settings", "attributes", "conditional", "pairs", "editing", "latent_map"]  # of each seed

PARTS = {"subject": SUBJECTS, "activity": ACTIVITIES, "place": PLACES}
STEPS, QUICK_STEPS = 2000, 60
ENCODER_POOLING = "mean"
QUICK_CONDITIONAL_STEPS = 20
LABELS_PER_CLASS = 20
SAMPLES_PER_LABEL, QUICK_SAMPLES_PER_LABEL = 20, 2
PAIR_REQUESTS, QUICK_PAIR_REQUESTS = 12, 2  # label pairs of each two parts, SAMPLES_PER_PAIR samples each
SAMPLES_PER_PAIR = 5
EDITS, QUICK_EDITS = 90, 6
MAX_NEW_TOKENS = 24
MAP_PART = "subject"  # the operator whose regions the map shows
MAP_GRID = 60  # points per side of the grid the regions are drawn from

EDITORS = {"flow": {"method": "flow"}, "gaussian": {"method": "gaussian"},
           "gaussian, keep_others": {"method": "gaussian", "keep_others": True}, CONDITIONAL: {"method": CONDITIONAL}}
GOALS = {"one attribute": 0.9, "two attributes": 0.8, "well-formed": 0.9, "editing": 0.8}


def well_formed(text: str) -> bool:
    parts = sentence_parts(text)
    return len(parts) == len(PARTS) and text == f"{parts['subject']} is {parts['activity']} {parts['place']} ."


def held_out(sentence: str) -> bool:
    """Whether a recombined sentence is one of the 36 combinations the model never trains on: those whose
    subject, activity and place indices sum to a multiple of 6 (every label of every part, and every pair of two
    parts' labels, is in exactly one of them)."""
    parts = sentence_parts(sentence)
    return sum(PARTS[name].index(parts[name]) for name in PARTS) % len(SUBJECTS) == 0


def train_model(processor, steps: int, seed: int, folder: Path) -> OptimusModel:
    """The demo's sizes, schedule and optimiser on this task's data: the recombined sentences but the held-out
    combinations, and the encoder's mean token state as the posterior's input (`encoder_pooling="mean"`) in place of
    the demo's BERT pooler, which carried the place in 1 model of 3 (docs/optimus.md)."""
    texts = [text for text in recombined_sentences() if not held_out(text)]
    random.Random(seed).shuffle(texts)
    torch.manual_seed(seed)
    config = optimus_config("gpt2", processor)
    config.encoder_pooling = ENCODER_POOLING
    model = OptimusModel(config)
    finetune_optimus(model, processor, Dataset.from_dict({"text": texts}), folder, max_steps=steps,
                     batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE, ratio_zero=RATIO_ZERO,
                     ratio_increase=RATIO_INCREASE, logging_steps=max(1, steps // 40),
                     warmup_steps=min(WARMUP_STEPS, steps // 10), seed=seed, print_logs=False, disable_tqdm=True)
    return model.eval()


def matches(text: str, request: dict) -> bool:
    return all(sentence_parts(text).get(name) == label for name, label in request.items())


def measure_sampling(setups, requests, samples, seed) -> dict:
    """Guided samples of each request by each method (`setups`: its space and operators; each from a generator of
    `seed`), and as many unguided draws from the flow's starting distribution on the frozen model."""
    space, operators = setups["flow"]
    mean, scale = latent_base(operators.values())
    generator = torch.Generator().manual_seed(seed)
    base_matched = sum(matches(text, request) for request in requests for text in
                       space.decode(mean + torch.randn((samples, len(mean)), generator=generator) @ scale.T))
    total = len(requests) * samples
    measured = {"samples": total, "unguided_match": base_matched / total}
    for method in METHODS:
        space, operators = setups[method]
        generator = torch.Generator().manual_seed(seed)
        matched = formed = 0
        outputs: list[str] = []
        seconds = 0.0
        for request in requests:
            started = time.perf_counter()
            texts = space.guided_sample(request, samples, operators=operators, generator=generator, method=method)
            seconds += time.perf_counter() - started
            outputs += texts
            matched += sum(matches(text, request) for text in texts)
            formed += sum(map(well_formed, texts))
        measured[method] = {"match": matched / total, "well_formed": formed / total,
                            "distinct": len(set(outputs)) / total, "seconds_per_100": 100 * seconds / total,
                            "examples": outputs[:: max(1, samples)][:6]}
    return measured


def measure_editing(space, operators, edits, editor: dict) -> dict:
    """The share of `edits` (sentence, {part: label}) whose output has the label and keeps the other parts."""
    results = []
    for source, request in edits:
        output = space.edit([source], request, operators=operators, **editor)[0]
        (name, label), = request.items()
        before, after = sentence_parts(source), sentence_parts(output)
        kept = all(after.get(other) == before[other] for other in PARTS if other != name)
        results.append({"source": source, "attribute": name, "label": label, "output": output,
                        "reached": after.get(name) == label, "kept": kept})
    return {"edits": len(results), "success": sum(r["reached"] and r["kept"] for r in results) / len(results),
            "reached": sum(r["reached"] for r in results) / len(results),
            "kept": sum(r["kept"] for r in results) / len(results),
            "by_attribute": {name: sum(r["reached"] and r["kept"] for r in results if r["attribute"] == name)
                             / max(1, sum(r["attribute"] == name for r in results)) for name in PARTS},
            "held_out_edits": sum(held_out(r["source"]) for r in results),
            "held_out_success": sum(r["reached"] and r["kept"] for r in results if held_out(r["source"]))
                                / max(1, sum(held_out(r["source"]) for r in results)),
            "examples": results[:6]}


def trained_model(args, steps: int, scratch: Path) -> tuple[OptimusModel, OptimusProcessor, float, bool]:
    """The seed's model and processor, its training seconds, and whether it was read from `--models`."""
    kept = args.models / f"seed-{args.seed}" if args.models else None
    if kept is not None and (kept / "training.json").is_file():
        training = json.loads((kept / "training.json").read_text())
        if training["steps"] == steps:
            print(f"seed {args.seed}: the model trained before in {kept} ({steps} steps)", flush=True)
            return (OptimusModel.from_pretrained(kept).eval(), OptimusProcessor.from_pretrained(kept),
                    training["training_seconds"], True)
    processor = build_processor(scratch / "tokenizers")
    print(f"seed {args.seed}: training the model ({steps} steps)", flush=True)
    started = time.perf_counter()
    model = train_model(processor, steps, args.seed, scratch / "model")
    seconds = round(time.perf_counter() - started, 1)
    if kept is not None:
        model.save_pretrained(kept)
        processor.save_pretrained(kept)
        (kept / "training.json").write_text(json.dumps({"steps": steps, "seed": args.seed,
                                                        "training_seconds": seconds}))
    return model, processor, seconds, False


def latent_map(space, operators, sentences, edit) -> dict:
    """Posterior means on the plane of one edit's flow path (its first axis) and their principal axis orthogonal to
    it, the `MAP_PART` operator's label on a grid of that plane, the flow's path and the `gaussian` method's (the
    straight move of its latent arithmetic, projected on the plane)."""
    from hf_ext.models.optimus.plots import project_to_plane

    source, request = edit
    means, _ = space.encode(sentences)
    start = space.encode([source])[0]
    _, path = edited_latents(operators, start, request, keep_path=True)
    path_latents = torch.cat(path)
    end = arithmetic_edited_latents(operators, start, request)
    gaussian_latents = start + torch.linspace(0, 1, 5)[:, None] * (end - start)
    (points, path_points, gaussian_points), _ = project_to_plane(
        means.numpy(), path_latents.numpy(), gaussian_latents.numpy(),
        first_axis=(path_latents[-1] - path_latents[0]).numpy())
    # the plane's axes in latent space, to map grid points back: least squares through the projected means
    centre = means.mean(0)
    axes = torch.linalg.lstsq(torch.tensor(points, dtype=torch.float32), means - centre).solution
    low, high = points.min(0) - 0.5, points.max(0) + 0.5
    xs, ys = (torch.linspace(float(low[i]), float(high[i]), MAP_GRID) for i in range(2))
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2)
    attribute = operators[MAP_PART]
    regions = attribute(centre + grid @ axes).argmax(-1).reshape(MAP_GRID, MAP_GRID)
    return {"part": MAP_PART, "labels": attribute.labels, "x": xs.tolist(), "y": ys.tolist(),
            "regions": regions.tolist(), "points": points.round(4).tolist(),
            "point_labels": [sentence_parts(text)[MAP_PART] for text in sentences],
            "path": path_points.round(4).tolist(), "path_texts": space.decode(path_latents[:: len(path) // 4]),
            "gaussian_path": gaussian_points.round(4).tolist(), "gaussian_path_texts": space.decode(gaussian_latents),
            "source": source, "request": request}


def run(args) -> dict:
    """One seed: the model trained with the demo's recipe, operators trained on it, sampling and editing measured."""
    quick = args.quick
    steps = QUICK_STEPS if quick else STEPS
    samples = QUICK_SAMPLES_PER_LABEL if quick else SAMPLES_PER_LABEL
    rng = random.Random(args.seed)
    recombined = recombined_sentences()
    with tempfile.TemporaryDirectory() as scratch:
        model, processor, training_seconds, reused = trained_model(args, steps, Path(scratch))
    space = OptimusLatentSpace(model, processor, max_new_tokens=MAX_NEW_TOKENS)
    means, _ = space.encode(recombined)
    reconstructions = space.decode(means)

    unseen = [held_out(text) for text in recombined]
    operators, attributes, labelled = {}, {}, {}
    for name, labels in PARTS.items():
        # labelled from the sentences the model trained on: the held-out combinations stay unseen by the operators too
        chosen = [text for label in labels for text in
                  rng.sample([text for text, new in zip(recombined, unseen, strict=True)
                              if not new and sentence_parts(text)[name] == label], LABELS_PER_CLASS)]
        labelled[name] = (chosen, [sentence_parts(text)[name] for text in chosen])
        keeps = [sentence_parts(output).get(name) == sentence_parts(text)[name]
                 for output, text in zip(reconstructions, recombined, strict=True)]
        started = time.perf_counter()
        operators[name] = train_latent_attribute(space, *labelled[name], name, seed=args.seed)
        attributes[name] = {
            "training_seconds": round(time.perf_counter() - started, 2),
            "parameters": sum(p.numel() for p in operators[name].parameters()),
            "accuracy": sum(predicted == sentence_parts(text)[name] for predicted, text in
                            zip(operators[name].predict(means), recombined, strict=True)) / len(recombined),
            "reconstruction_keeps": sum(keeps) / len(keeps),
            "reconstruction_keeps_held_out": sum(kept for kept, new in zip(keeps, unseen, strict=True) if new)
                                             / sum(unseen)}
    print(f"seed {args.seed}: fine-tuning a copy of the model with label embeddings (method {CONDITIONAL})",
          flush=True)
    conditional_steps = QUICK_CONDITIONAL_STEPS if quick else CONDITIONAL_STEPS
    conditional_model = copy.deepcopy(model)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        conditional_operators, trainer = train_label_conditional(
            conditional_model, processor, labelled, scratch, steps=conditional_steps, seed=args.seed,
            logging_steps=max(1, conditional_steps // 10), disable_tqdm=True)
    conditional_seconds = round(time.perf_counter() - started, 1)
    conditional_space = OptimusLatentSpace(conditional_model, processor, max_new_tokens=MAX_NEW_TOKENS)
    setups = {"gaussian": (space, operators), "flow": (space, operators),
              CONDITIONAL: (conditional_space, conditional_operators)}
    conditional = {"steps": conditional_steps, "learning_rate": CONDITIONAL_LEARNING_RATE,
                   "training_seconds": conditional_seconds,
                   "train_loss": [entry["train_loss"] for entry in trainer.state.log_history
                                  if "train_loss" in entry][-1],
                   "sentences": len({text for texts, _ in labelled.values() for text in texts})}
    for name, labels in PARTS.items():
        print(f"seed {args.seed}: guided sampling of the {name}", flush=True)
        attributes[name].update(measure_sampling(setups, [{name: label} for label in labels], samples, args.seed))
    pairs = {}
    for first, second in itertools.combinations(PARTS, 2):
        combinations = list(itertools.product(PARTS[first], PARTS[second]))
        requests = [{first: a, second: b} for a, b in
                    rng.sample(combinations, QUICK_PAIR_REQUESTS if quick else PAIR_REQUESTS)]
        pairs[f"{first} + {second}"] = measure_sampling(setups, requests, SAMPLES_PER_PAIR, args.seed)

    print(f"seed {args.seed}: editing", flush=True)
    edits = []
    for _ in range(QUICK_EDITS if quick else EDITS):
        source = rng.choice(recombined)
        name = rng.choice(list(PARTS))
        parts = sentence_parts(source)
        edits.append((source, {name: rng.choice([label for label in PARTS[name] if label != parts[name]])}))
    editing = {editor: measure_editing(*setups[settings["method"]], edits, settings)
               for editor, settings in EDITORS.items()}
    map_source = recombined[0]
    return {"settings": {"steps": steps, "labels_per_class": LABELS_PER_CLASS, "samples_per_label": samples,
                         "samples_per_pair": SAMPLES_PER_PAIR, "training_seconds": training_seconds,
                         "model_trained_before": reused,
                         "gaussian_temperature": GAUSSIAN_TEMPERATURE, "label_shrinkage": LABEL_SHRINKAGE},
            "attributes": attributes, "conditional": conditional, "pairs": pairs, "editing": editing,
            "latent_map": latent_map(space, operators, recombined, (map_source, {MAP_PART: SUBJECTS[1]}))}


def claims(results: dict) -> list[tuple[str, object]]:
    def single(seed, name, method):
        return seed["attributes"][name][method]["match"]

    found = []
    for method in METHODS:
        found += [
            (f"{method}: guided sampling matches one requested part >= {GOALS['one attribute']} (each part)",
             lambda seed, m=method: all(single(seed, name, m) >= GOALS["one attribute"] for name in PARTS)),
            (f"{method}: guided sampling matches more often than unguided draws (each part)",
             lambda seed, m=method: all(single(seed, name, m) > seed["attributes"][name]["unguided_match"]
                                        for name in PARTS)),
            (f"{method}: two parts combined match >= {GOALS['two attributes']} (each pair)",
             lambda seed, m=method: all(pair[m]["match"] >= GOALS["two attributes"]
                                        for pair in seed["pairs"].values())),
            (f"{method}: guided samples well-formed >= {GOALS['well-formed']}",
             lambda seed, m=method: all(seed["attributes"][name][m]["well_formed"] >= GOALS["well-formed"]
                                        for name in PARTS)),
            (f"{method}: edits reach the target and keep the other parts >= {GOALS['editing']}",
             lambda seed, m=method: seed["editing"][m]["success"] >= GOALS["editing"]),
        ]
    found.insert(0, ("the reconstructions keep every part >= 0.99, of the 216 sentences and of the 36 held out",
                     lambda seed: all(min(seed["attributes"][name]["reconstruction_keeps"],
                                          seed["attributes"][name]["reconstruction_keeps_held_out"]) >= 0.99
                                      for name in PARTS)))
    for other in ("flow", CONDITIONAL):
        found.append((f"gaussian matches one part at least as often as {other} (each part)",
                      lambda seed, o=other: all(single(seed, name, "gaussian") >= single(seed, name, o)
                                                for name in PARTS)))
        found.append((f"gaussian edits succeed more often than {other} edits",
                      lambda seed, o=other: seed["editing"]["gaussian"]["success"] > seed["editing"][o]["success"]))
    return found


def tables(results: dict) -> str:
    def cell(read, digits=2):
        return spread(values(results, read), digits)

    first = results["per_seed"][0]
    rows = [[name, f"{len(PARTS[name])} x {first['settings']['labels_per_class']}",
             f"{first['attributes'][name]['parameters']:,}",
             cell(lambda seed, n=name: seed["attributes"][n]["accuracy"]),
             cell(lambda seed, n=name: seed["attributes"][n]["reconstruction_keeps"]),
             cell(lambda seed, n=name: seed["attributes"][n]["reconstruction_keeps_held_out"]),
             cell(lambda seed, n=name: seed["attributes"][n]["unguided_match"])] for name in PARTS]
    operators = markdown_table(["part", "labels x sentences", "classifier parameters", "classifier accuracy (216 "
                                "sentences)", "reconstruction keeps the part (216)", "... of the 36 held out",
                                "unguided: part matches"], rows)
    rows = [[name, method,
             cell(lambda seed, n=name, m=method: seed["attributes"][n][m]["match"]),
             cell(lambda seed, n=name, m=method: seed["attributes"][n][m]["well_formed"]),
             cell(lambda seed, n=name, m=method: seed["attributes"][n][m]["distinct"]),
             cell(lambda seed, n=name, m=method: seed["attributes"][n][m]["seconds_per_100"], 1)]
            for name in PARTS for method in METHODS]
    single = markdown_table(["part", "method", "guided: part matches", "well-formed", "distinct",
                             "seconds per 100 samples"], rows)
    pair_rows = [[pair, method, cell(lambda seed, p=pair, m=method: seed["pairs"][p][m]["match"]),
                  cell(lambda seed, p=pair: seed["pairs"][p]["unguided_match"]),
                  cell(lambda seed, p=pair, m=method: seed["pairs"][p][m]["well_formed"]),
                  cell(lambda seed, p=pair, m=method: seed["pairs"][p][m]["distinct"])]
                 for pair in first["pairs"] for method in METHODS]
    pairs = markdown_table(["two parts", "method", "guided: both match", "unguided: both match", "well-formed",
                            "distinct"], pair_rows)
    edit_rows = [[editor, cell(lambda seed, e=editor: seed["editing"][e]["success"]),
                  cell(lambda seed, e=editor: seed["editing"][e]["reached"]),
                  cell(lambda seed, e=editor: seed["editing"][e]["kept"])]
                 + [cell(lambda seed, e=editor, n=name: seed["editing"][e]["by_attribute"][n]) for name in PARTS]
                 + [cell(lambda seed, e=editor: seed["editing"][e]["held_out_success"])]
                 for editor in EDITORS]
    editing = markdown_table([f"editing ({first['editing']['flow']['edits']} edits per seed)", "target reached, "
                              "other parts kept", "target reached", "other parts kept",
                              *(f"success, edits of the {name}" for name in PARTS),
                              "success, held-out sentences"], edit_rows)
    conditional = markdown_table(
        [f"fine-tuning of method {CONDITIONAL}", "labelled sentences", "steps", "learning rate", "seconds",
         "final training loss"],
        [["the whole model, label embeddings added to z",
          "-".join(str(int(f(values(results, lambda seed: seed["conditional"]["sentences"])))) for f in (min, max)),
          first["conditional"]["steps"], first["conditional"]["learning_rate"],
          cell(lambda seed: seed["conditional"]["training_seconds"], 0),
          cell(lambda seed: seed["conditional"]["train_loss"])]])
    claim_rows = [[claim, holds(results, test)] for claim, test in claims(results)]
    return "\n\n".join([operators, conditional, single, pairs, editing,
                         markdown_table(["claim", "holds in (seeds)"], claim_rows)])


def draw(pyplot, results: dict, path: Path) -> None:
    """Seed 0's latent map: the subject operator's regions, the posterior means coloured by their subject, one edit's
    paths (the flow's and the gaussian method's)."""
    from hf_ext.models.optimus.plots import plot_attribute_map

    plot_attribute_map(results["per_seed"][0]["latent_map"], path,
                       title=f"Optimus latent space (seed {results['per_seed'][0]['seed']}): attribute regions and "
                       "an edit by two methods")


def parser():
    arguments = reproduction_parser(__doc__)
    arguments.add_argument("--models", type=Path, help="keep each seed's trained model here, and measure those kept "
                           "before instead of training again")
    return arguments


if __name__ == "__main__":
    main(parser(), run, tables, draw)
