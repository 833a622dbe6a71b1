"""Guided generation and editing in Optimus' latent space (issue 31; the paper's Section 5.3 by the method of
LatentOps, Liu et al., EMNLP 2023): attribute classifiers on the latent of a frozen model, trained from at most 20
labelled sentences per class, steer an ODE sampler and an editor (`hf_ext.models.optimus.attributes`).

Model: the demo's recipe and data (`hf_ext/models/optimus/demo.py`, with `optimus_decoders.py`'s GPT-2 set-up): the
40 bundled sentences and 216 recombined from their parts (subject, activity, place), 5,000 steps. Attributes: the
three parts, so that every decoded sentence can be parsed back (`demo.sentence_parts`): a sentence is well-formed
when it is exactly "SUBJECT is ACTIVITY PLACE ." with known parts. Operators: one per part, trained on 20 recombined
sentences per label. Measured, per seed:

- guided sampling, one attribute: every label of every part, `SAMPLES_PER_LABEL` samples each: the share whose
  parsed part is the requested one, beside the same count drawn from the sampler's starting distribution without
  guidance; the share well-formed; the share of distinct outputs; seconds per 100 samples (flow and decoding);
- two attributes combined: `PAIR_REQUESTS` random label pairs of each two parts, the share matching both;
- editing: `EDITS` random (recombined sentence, part, other label) requests: the share whose output has the target
  label and keeps the other two parts, and beside it the reconstruction's own share keeping each part (what the
  latent carries: an edit cannot keep what the model does not encode);
- the latent map of seed 0: posterior means on a plane, the subject operator's regions and one edit's path.

    python reproductions/optimus_guided.py --jobs 2 --threads 1 \\
        --output reproductions/results/optimus_guided.json --plot docs/images/optimus_guided.png
"""

import itertools
import random
import tempfile
import time
from pathlib import Path

import torch
from common import holds, main, markdown_table, reproduction_parser, spread, values
from datasets import Dataset
from optimus_decoders import build_processor, optimus_config

from hf_ext.models.optimus import OptimusLatentSpace, OptimusModel
from hf_ext.models.optimus.attributes import (
    edited_latents,
    latent_base,
    train_latent_attribute,
)
from hf_ext.models.optimus.demo import (
    ACTIVITIES,
    BATCH_SIZE,
    BUNDLED_REPEATS,
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
from hf_ext.sample_text import bundled_sentences

RESULT_KEYS = ["settings", "attributes", "pairs", "editing", "latent_map"]  # of each seed

PARTS = {"subject": SUBJECTS, "activity": ACTIVITIES, "place": PLACES}
STEPS, QUICK_STEPS = 5000, 60
LABELS_PER_CLASS = 20
SAMPLES_PER_LABEL, QUICK_SAMPLES_PER_LABEL = 20, 2
PAIR_REQUESTS, QUICK_PAIR_REQUESTS = 12, 2  # label pairs of each two parts, SAMPLES_PER_PAIR samples each
SAMPLES_PER_PAIR = 5
EDITS, QUICK_EDITS = 90, 6
MAX_NEW_TOKENS = 24
MAP_PART = "subject"  # the operator whose regions the map shows
MAP_GRID = 60  # points per side of the grid the regions are drawn from

GOALS = {"one attribute": 0.9, "two attributes": 0.8, "well-formed": 0.9, "editing": 0.8}


def well_formed(text: str) -> bool:
    parts = sentence_parts(text)
    return len(parts) == len(PARTS) and text == f"{parts['subject']} is {parts['activity']} {parts['place']} ."


def train_model(processor, steps: int, seed: int, folder: Path) -> OptimusModel:
    """The demo's recipe with the GPT-2 decoder."""
    texts = bundled_sentences() * BUNDLED_REPEATS + recombined_sentences()
    random.Random(seed).shuffle(texts)
    torch.manual_seed(seed)
    model = OptimusModel(optimus_config("gpt2", processor))
    finetune_optimus(model, processor, Dataset.from_dict({"text": texts}), folder, max_steps=steps,
                     batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE, ratio_zero=RATIO_ZERO,
                     ratio_increase=RATIO_INCREASE, logging_steps=max(1, steps // 40),
                     warmup_steps=min(WARMUP_STEPS, steps // 10), seed=seed, print_logs=False, disable_tqdm=True)
    return model.eval()


def measure_sampling(space, operators, requests, samples, generator) -> dict:
    """Guided samples of each request, and as many unguided draws from the flow's starting distribution."""
    matched = base_matched = formed = 0
    outputs: list[str] = []
    seconds = 0.0
    mean, scale = latent_base(operators.values())
    for request in requests:
        started = time.perf_counter()
        texts = space.guided_sample(request, samples, operators=operators, generator=generator)
        seconds += time.perf_counter() - started
        base = space.decode(mean + torch.randn((samples, len(mean)), generator=generator) @ scale.T)
        outputs += texts
        matched += sum(all(sentence_parts(text).get(name) == label for name, label in request.items())
                       for text in texts)
        base_matched += sum(all(sentence_parts(text).get(name) == label for name, label in request.items())
                            for text in base)
        formed += sum(map(well_formed, texts))
    total = len(requests) * samples
    return {"samples": total, "match": matched / total, "unguided_match": base_matched / total,
            "well_formed": formed / total, "distinct": len(set(outputs)) / total,
            "seconds_per_100": 100 * seconds / total, "examples": outputs[:: max(1, samples)][:6]}


def latent_map(space, operators, sentences, edit) -> dict:
    """Posterior means on the plane of one edit's path (its first axis) and their principal axis orthogonal to it,
    the `MAP_PART` operator's label on a grid of that plane, and the path."""
    from hf_ext.models.optimus.plots import project_to_plane

    source, request = edit
    means, _ = space.encode(sentences)
    _, path = edited_latents(operators, space.encode([source])[0], request, keep_path=True)
    path_latents = torch.cat(path)
    (points, path_points), _ = project_to_plane(means.numpy(), path_latents.numpy(),
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
            "source": source, "request": request}


def run(args) -> dict:
    """One seed: the model trained with the demo's recipe, operators trained on it, sampling and editing measured."""
    quick = args.quick
    steps = QUICK_STEPS if quick else STEPS
    samples = QUICK_SAMPLES_PER_LABEL if quick else SAMPLES_PER_LABEL
    rng = random.Random(args.seed)
    recombined = recombined_sentences()
    with tempfile.TemporaryDirectory() as scratch:
        processor = build_processor(Path(scratch) / "tokenizers")
        print(f"seed {args.seed}: training the model ({steps} steps)", flush=True)
        started = time.perf_counter()
        model = train_model(processor, steps, args.seed, Path(scratch) / "model")
    training_seconds = time.perf_counter() - started
    space = OptimusLatentSpace(model, processor, max_new_tokens=MAX_NEW_TOKENS)
    means, _ = space.encode(recombined)
    reconstructions = space.decode(means)

    operators, attributes = {}, {}
    for name, labels in PARTS.items():
        chosen = [text for label in labels for text in
                  rng.sample([text for text in recombined if sentence_parts(text)[name] == label], LABELS_PER_CLASS)]
        started = time.perf_counter()
        operators[name] = train_latent_attribute(space, chosen, [sentence_parts(text)[name] for text in chosen], name,
                                                 seed=args.seed)
        attributes[name] = {
            "training_seconds": round(time.perf_counter() - started, 2),
            "parameters": sum(p.numel() for p in operators[name].parameters()),
            "accuracy": sum(predicted == sentence_parts(text)[name] for predicted, text in
                            zip(operators[name].predict(means), recombined, strict=True)) / len(recombined),
            "reconstruction_keeps": sum(sentence_parts(output).get(name) == sentence_parts(text)[name]
                                        for output, text in zip(reconstructions, recombined, strict=True))
                                    / len(recombined)}
    generator = torch.Generator().manual_seed(args.seed)
    for name, labels in PARTS.items():
        print(f"seed {args.seed}: guided sampling of the {name}", flush=True)
        attributes[name].update(measure_sampling(space, operators, [{name: label} for label in labels], samples,
                                                 generator))
    pairs = {}
    for first, second in itertools.combinations(PARTS, 2):
        combinations = list(itertools.product(PARTS[first], PARTS[second]))
        requests = [{first: a, second: b} for a, b in
                    rng.sample(combinations, QUICK_PAIR_REQUESTS if quick else PAIR_REQUESTS)]
        pairs[f"{first} + {second}"] = measure_sampling(space, operators, requests, SAMPLES_PER_PAIR, generator)

    print(f"seed {args.seed}: editing", flush=True)
    edits = []
    for _ in range(QUICK_EDITS if quick else EDITS):
        source = rng.choice(recombined)
        name = rng.choice(list(PARTS))
        parts = sentence_parts(source)
        edits.append((source, {name: rng.choice([label for label in PARTS[name] if label != parts[name]])}))
    outputs = [space.edit([source], request, operators=operators)[0] for source, request in edits]
    results = []
    for (source, request), output in zip(edits, outputs, strict=True):
        (name, label), = request.items()
        before, after = sentence_parts(source), sentence_parts(output)
        kept = all(after.get(other) == before[other] for other in PARTS if other != name)
        results.append({"source": source, "attribute": name, "label": label, "output": output,
                        "reached": after.get(name) == label, "kept": kept})
    editing = {"edits": len(results), "success": sum(r["reached"] and r["kept"] for r in results) / len(results),
               "reached": sum(r["reached"] for r in results) / len(results),
               "kept": sum(r["kept"] for r in results) / len(results),
               "by_attribute": {name: sum(r["reached"] and r["kept"] for r in results if r["attribute"] == name)
                                / max(1, sum(r["attribute"] == name for r in results)) for name in PARTS},
               "examples": results[:6]}
    map_source = recombined[0]
    return {"settings": {"steps": steps, "labels_per_class": LABELS_PER_CLASS, "samples_per_label": samples,
                         "samples_per_pair": SAMPLES_PER_PAIR, "training_seconds": round(training_seconds, 1)},
            "attributes": attributes, "pairs": pairs, "editing": editing,
            "latent_map": latent_map(space, operators, recombined, (map_source, {MAP_PART: SUBJECTS[1]}))}


def claims(results: dict) -> list[tuple[str, object]]:
    def single(seed, name):
        return seed["attributes"][name]["match"]

    return [
        (f"guided sampling matches one requested part >= {GOALS['one attribute']} (each part)",
         lambda seed: all(single(seed, name) >= GOALS["one attribute"] for name in PARTS)),
        ("... for the subject and the activity (the parts the reconstructions keep)",
         lambda seed: all(single(seed, name) >= GOALS["one attribute"] for name in ("subject", "activity"))),
        ("guided sampling matches more often than unguided draws (each part)",
         lambda seed: all(single(seed, name) > seed["attributes"][name]["unguided_match"] for name in PARTS)),
        (f"two parts combined match >= {GOALS['two attributes']} (each pair)",
         lambda seed: all(pair["match"] >= GOALS["two attributes"] for pair in seed["pairs"].values())),
        (f"guided samples well-formed >= {GOALS['well-formed']}",
         lambda seed: all(seed["attributes"][name]["well_formed"] >= GOALS["well-formed"] for name in PARTS)),
        (f"edits reach the target and keep the other parts >= {GOALS['editing']}",
         lambda seed: seed["editing"]["success"] >= GOALS["editing"]),
    ]


def tables(results: dict) -> str:
    def cell(read, digits=2):
        return spread(values(results, read), digits)

    first = results["per_seed"][0]
    rows = [[name, f"{len(PARTS[name])} x {first['settings']['labels_per_class']}",
             f"{first['attributes'][name]['parameters']:,}",
             cell(lambda seed, n=name: seed["attributes"][n]["accuracy"]),
             cell(lambda seed, n=name: seed["attributes"][n]["reconstruction_keeps"]),
             cell(lambda seed, n=name: seed["attributes"][n]["match"]),
             cell(lambda seed, n=name: seed["attributes"][n]["unguided_match"]),
             cell(lambda seed, n=name: seed["attributes"][n]["well_formed"]),
             cell(lambda seed, n=name: seed["attributes"][n]["distinct"]),
             cell(lambda seed, n=name: seed["attributes"][n]["seconds_per_100"], 1)] for name in PARTS]
    single = markdown_table(["part", "labels x sentences", "classifier parameters", "classifier accuracy (216 "
                             "sentences)", "reconstruction keeps the part", "guided: part matches", "unguided: "
                             "part matches", "well-formed", "distinct", "seconds per 100 samples"], rows)
    pair_rows = [[pair, cell(lambda seed, p=pair: seed["pairs"][p]["match"]),
                  cell(lambda seed, p=pair: seed["pairs"][p]["unguided_match"]),
                  cell(lambda seed, p=pair: seed["pairs"][p]["well_formed"]),
                  cell(lambda seed, p=pair: seed["pairs"][p]["distinct"])] for pair in first["pairs"]]
    pairs = markdown_table(["two parts", "guided: both match", "unguided: both match", "well-formed", "distinct"],
                           pair_rows)
    edit_rows = [["all", cell(lambda seed: seed["editing"]["success"]), cell(lambda seed: seed["editing"]["reached"]),
                  cell(lambda seed: seed["editing"]["kept"])]]
    edit_rows += [[f"edits of the {name}", cell(lambda seed, n=name: seed["editing"]["by_attribute"][n]), "", ""]
                  for name in PARTS]
    editing = markdown_table([f"editing ({first['editing']['edits']} edits per seed)", "target reached, other "
                              "parts kept", "target reached", "other parts kept"], edit_rows)
    claim_rows = [[claim, holds(results, test)] for claim, test in claims(results)]
    return "\n\n".join([single, pairs, editing, markdown_table(["claim", "holds in (seeds)"], claim_rows)])


def draw(pyplot, results: dict, path: Path) -> None:
    """Seed 0's latent map: the subject operator's regions, the posterior means coloured by their subject, one edit's
    path."""
    from hf_ext.models.optimus.plots import plot_attribute_map

    plot_attribute_map(results["per_seed"][0]["latent_map"], path,
                       title=f"Optimus latent space (seed {results['per_seed'][0]['seed']}): attribute regions and "
                       "an edit")


if __name__ == "__main__":
    main(reproduction_parser(__doc__), run, tables, draw)
