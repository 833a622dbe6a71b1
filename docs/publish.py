"""Publishes measured figures into the pages, so that a page cannot drift from what a run produced.

Every figure in README.md and docs/*.md that comes from a run lives in a committed results file, written by the
run itself with the commit, the command, the machine and the versions that produced it:

- `reproductions/results/*.json`: the reproduction scripts (`--output`), every seed's figures;
- `benchmarks/results/*.json`: the benchmark scripts (`--output`), every timed round and ratio;
- `docs/results/conversions.json`: `hf-ext convert ... --reference` on every fixture of `tests/fixtures/`, the
  parity lines it printed (`python docs/publish.py --record-conversions`);
- `docs/results/demo.json`: `hf-ext demo` with seeds 0 to 3, what each measured, and what seed 0 printed
  (`python docs/publish.py --record-demo` runs them, and copies seed 0's picture to docs/images/optimus_demo.png).

A page shows such figures only between two markers, the first naming the results file and, for the demo and the
conversions, the view (the demo's `transcript`, `seeds` or `interpolation`; a converter's name):

    <!-- figures from reproductions/results/optimus_kl_vanishing.json -->
    ...generated...
    <!-- end of figures -->

and what lies between them is generated from the file: the reproduction script's own `tables()` for a
reproduction, the transcript or the table of seeds for the demo, each after a line saying where the figures came
from.

    python docs/publish.py                # rewrite every block from its results file
    python docs/publish.py --check        # exit 1 naming each block that differs (tests/test_published_figures.py)
    python docs/publish.py --record-demo  # run `hf-ext demo` and write docs/results/demo.json, then publish
"""

import argparse
import datetime
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- figures from (?P<source>\S+)(?: (?P<view>[\w-]+))? -->\n)(?P<body>.*?)"
                   r"(<!-- end of figures -->)", re.DOTALL)
DEMO_RESULTS = ROOT / "docs" / "results" / "demo.json"
DEMO_SEEDS = (0, 1, 2, 3)
DEMO_PICTURE = ROOT / "docs" / "images" / "optimus_demo.png"  # seed 0's demo.png
CONVERSIONS_RESULTS = ROOT / "docs" / "results" / "conversions.json"
# converter: the fixtures it converts, each (source, reference), relative to the repository root
# converter -> its fixtures: (source, reference, further arguments of `hf-ext convert`)
FIXTURE_CONVERSIONS: dict[str, list[tuple[str, ...]]] = {
    "optimus": [("tests/fixtures/optimus/tiny", "tests/fixtures/optimus/tiny/reference.safetensors")],
    "universal-transformer": [("tests/fixtures/universal_transformer/tiny",
                               "tests/fixtures/universal_transformer/tiny/reference.safetensors")],
    "mtdnn": [("tests/fixtures/mtdnn/tiny/model_0.pt", "tests/fixtures/mtdnn/tiny/reference.safetensors"),
              # ranking groups of 3: the checkpoint does not record group sizes
              ("tests/fixtures/mtdnn/roberta/model_0.pt", "tests/fixtures/mtdnn/roberta/reference.safetensors",
               "--group-size", "qnnli=3"),
              ("tests/fixtures/mtdnn/deberta/model_0.pt", "tests/fixtures/mtdnn/deberta/reference.safetensors"),
              ("tests/fixtures/mtdnn/electra/model_0.pt", "tests/fixtures/mtdnn/electra/reference.safetensors"),
              ("tests/fixtures/mtdnn/token_tasks/model_0.pt",
               "tests/fixtures/mtdnn/token_tasks/reference.safetensors")],
    "ernie2": [("tests/fixtures/ernie2/tiny/paddle_static", "tests/fixtures/ernie2/tiny/reference.safetensors"),
               ("tests/fixtures/ernie2/tiny/paddlenlp", "tests/fixtures/ernie2/tiny/reference.safetensors")],
}
PARITY_LINE = re.compile(r"^(?P<output>.+): max abs error (?P<error>\S+) \(tolerance: (?P<tolerance>.+)\)$")


def read_results(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"{path.relative_to(ROOT)}: no such results file (named by a page's figures block)") from None


def provenance(source: str, results: dict, view: str | None = None) -> str:
    """One line on where the figures come from: the file, the command, the commit, the machine, the time."""
    seeds = [results["per_seed"][0]["seed"]] if view == "transcript" else results.get("seeds")
    runs = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} of " if seeds else ""
    versions = ", ".join(f"{name} {version}" for name, version in results["versions"].items())
    return (f"*Figures from `{source}`: {runs}`{results['command']}` at commit `{results['commit'][:12]}` on "
            f"{results['date']}; {results['machine']}; {versions}; {results['seconds']:,.0f} s.*")


def script_tables(results: dict) -> str:
    """The tables the script that wrote these results makes of them: a reproduction's `tables()`, a benchmark's own
    `tables()` or else `benchmarks/timing.py`'s."""
    script = ROOT / results["script"]
    sys.path.insert(0, str(script.parent))  # the scripts import their `common` / `timing` module
    try:
        spec = importlib.util.spec_from_file_location(f"{script.parent.name}_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        tables = getattr(module, "tables", None) or sys.modules["timing"].tables
    finally:
        sys.path.remove(str(script.parent))
    return tables(results)


def interpolation_steps(steps: list[dict]) -> str:
    """The steps between an interpolation's ends, with the parts each has of the first / of the last sentence."""
    first, last = steps[0]["text"], steps[-1]["text"]
    shown = []
    for step in steps[1:-1]:
        if step["text"] in (first, last):
            shown.append("the first sentence again" if step["text"] == first else "the last sentence")
        else:
            shown.append(f"{step['text'].removesuffix(' .')} ({len(step['parts_from_source'])}/"
                         f"{len(step['parts_from_target'])})")
    return "; ".join(shown)


def demo_view(results: dict, view: str | None) -> str:
    """What seed 0 printed (`transcript`), each seed's figures (`seeds`) or interpolation (`interpolation`)."""
    if view == "transcript":
        return f"```text\n{results['stdout'].rstrip()}\n```"
    if view == "seeds":
        rows = ["| seed | reconstructed word for word | mean word accuracy | different outputs | KL (nats) | active "
                "units | mutual information (nats) | seconds |", "|---|---|---|---|---|---|---|---|"]
        rows += [f"| {run['seed']} | {run['exact']} of {run['sentences']} | {run['mean_word_accuracy']:.1%} | "
                 f"{run['different_outputs']} | {run['kl']:.1f} | {run['active_units']}/{run['latent_size']} | "
                 f"{run['mutual_information']:.2f} | {run['seconds']:.0f} |" for run in results["per_seed"]]
        return "\n".join(rows)
    if view == "interpolation":
        rows = ["| seed | the steps between the ends (parts of the first / of the last) |", "|---|---|"]
        rows += [f"| {run['seed']} | {interpolation_steps(run['interpolation'])} |" for run in results["per_seed"]]
        return "\n".join(rows)
    raise SystemExit(f"the demo's figures have the views transcript, seeds and interpolation, not {view!r}")


def conversion_view(results: dict, converter: str) -> str:
    """Each output's maximum absolute error against the original's, one column per converted fixture (a dash where
    a fixture has no such output: fixtures hold different tasks)."""
    if converter not in results["converters"]:
        raise SystemExit(f"the conversions' figures have the views {', '.join(results['converters'])}, not "
                         f"{converter!r}")
    runs = results["converters"][converter]
    columns = " | ".join(f"`{run['source'].removeprefix('tests/fixtures/')}`" for run in runs)
    rows = [f"| output | {columns} | tolerance |", "|---|" + "---|" * len(runs) + "---|"]
    checks = [{check["output"]: check for check in run["checks"]} for run in runs]
    outputs = list(dict.fromkeys(check["output"] for run in runs for check in run["checks"]))
    for output in outputs:
        errors = " | ".join(found[output]["error"] if output in found else "—" for found in checks)
        tolerances = sorted({found[output]["tolerance"] for found in checks if output in found})
        rows.append(f"| `{output}` | {errors} | {'; '.join(tolerances)} |")
    return "\n".join(rows)


def render(source: str, view: str | None = None) -> str:
    """The block's body for the results file `source` (relative to the repository root)."""
    results = read_results(ROOT / source)
    if results.get("quick"):
        raise SystemExit(f"{source}: a --quick smoke run, not a result; rerun without --quick")
    if source == DEMO_RESULTS.relative_to(ROOT).as_posix():
        body = demo_view(results, view)
    elif source == CONVERSIONS_RESULTS.relative_to(ROOT).as_posix():
        body = conversion_view(results, view)
    else:
        body = script_tables(results)
    return f"{provenance(source, results, view)}\n\n{body}\n"


def published(text: str) -> str:
    """`text` with every figures block generated anew."""
    return BLOCK.sub(lambda match: match.group(1) + render(match.group("source"), match.group("view"))
                     + match.group(5), text)


def stale_blocks(text: str) -> list[str]:
    """The results files whose block in `text` differs from what they generate, with the first differing line."""
    stale = []
    for match in BLOCK.finditer(text):
        expected = render(match.group("source"), match.group("view")).splitlines()
        found = match.group("body").splitlines()
        if expected != found:
            line = next((i for i, (a, b) in enumerate(zip(expected, found, strict=False)) if a != b),
                        min(len(expected), len(found)))
            shown = found[line] if line < len(found) else "(the block ends)"
            wanted = expected[line] if line < len(expected) else "(the block should end)"
            stale.append(f"{match.group('source')}: line {line + 1} of the block reads {shown!r}, the results give "
                         f"{wanted!r}")
    return stale


def record_demo() -> None:
    """Run `hf-ext demo` once per seed of `DEMO_SEEDS` in a scratch folder, one at a time (the demo's timings are
    part of what it prints), and write what seed 0 printed and what every seed measured to the demo's results."""
    from hf_ext.provenance import checkout_commit, machine_description, software_versions, write_results

    code = checkout_commit(ROOT)
    per_seed, stdout, started = [], None, time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for seed in DEMO_SEEDS:
            workdir = Path(scratch) / f"seed-{seed}"
            command = ["hf-ext", "demo"] + ([] if seed == 0 else ["--seed", str(seed)])
            printed = subprocess.run([*command, "--workdir", str(workdir)], capture_output=True, text=True)
            if printed.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed:\n{printed.stderr[-2000:]}")
            print(f"seed {seed}: done", flush=True)
            if seed == 0:
                # the transcript shows the default folder, as a user's run prints it; the page's picture is its own
                stdout = printed.stdout.replace(str(workdir), "hf-ext-demo")
                if (workdir / "demo.png").exists():
                    shutil.copyfile(workdir / "demo.png", DEMO_PICTURE)
            run = json.loads((workdir / "demo.json").read_text(encoding="utf-8"))
            accuracies = [item["word_accuracy"] for item in run["reconstructions"]]
            per_seed.append({
                "seed": seed, "sentences": len(accuracies), "exact": sum(a == 1.0 for a in accuracies),
                "mean_word_accuracy": sum(accuracies) / len(accuracies),
                "different_outputs": len({item["output"] for item in run["reconstructions"]}),
                "kl": run["kl"], "active_units": run["active_units"], "latent_size": run["latent_size"],
                "mutual_information": run["mutual_information"], "seconds": run["seconds"],
                "interpolation": [{key: step[key] for key in ("t", "text", "parts_from_source", "parts_from_target")}
                                  for step in run["interpolation"]["steps"]]})
    results = {"command": "python docs/publish.py --record-demo", "commit": code,
               "date": datetime.date.today().isoformat(),
               "machine": machine_description(), "versions": software_versions(),
               "seeds": list(DEMO_SEEDS), "seconds": round(time.perf_counter() - started, 1), "stdout": stdout,
               "per_seed": per_seed}
    write_results(DEMO_RESULTS, results)
    print(f"wrote {DEMO_RESULTS.relative_to(ROOT)}")


def record_conversions() -> None:
    """Convert every fixture with `hf-ext convert ... --reference` and record the parity lines it prints."""
    from hf_ext.provenance import checkout_commit, machine_description, software_versions, write_results

    code, started, converters = checkout_commit(ROOT), time.perf_counter(), {}
    with tempfile.TemporaryDirectory() as scratch:
        for converter, fixtures in FIXTURE_CONVERSIONS.items():
            converters[converter] = []
            for number, (source, reference, *arguments) in enumerate(fixtures):
                command = ["hf-ext", "convert", converter, source, "OUT", "--reference", reference, *arguments]
                printed = subprocess.run([*command[:4], str(Path(scratch) / f"{converter}-{number}"), *command[5:]],
                                         cwd=ROOT, capture_output=True, text=True)
                if printed.returncode != 0:
                    raise SystemExit(f"{' '.join(command)} failed:\n{printed.stderr[-2000:]}")
                checks = [match.groupdict() for line in printed.stdout.splitlines()
                          if (match := PARITY_LINE.match(line))]
                converters[converter].append({"command": " ".join(command), "source": source, "checks": checks})
                print(f"{' '.join(command)}: {len(checks)} checks", flush=True)
    results = {"command": "python docs/publish.py --record-conversions", "commit": code,
               "date": datetime.date.today().isoformat(), "machine": machine_description(),
               "versions": software_versions(),
               "seconds": round(time.perf_counter() - started, 1), "converters": converters}
    write_results(CONVERSIONS_RESULTS, results)
    print(f"wrote {CONVERSIONS_RESULTS.relative_to(ROOT)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every stale block")
    parser.add_argument("--record-demo", action="store_true", help="run hf-ext demo and record it first")
    parser.add_argument("--record-conversions", action="store_true",
                        help="convert every fixture with --reference and record the parity lines first")
    args = parser.parse_args(argv)
    if args.record_demo:
        record_demo()
    if args.record_conversions:
        record_conversions()
    stale = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if args.check:
            stale += [f"{page.relative_to(ROOT)}: {problem}" for problem in stale_blocks(text)]
        elif (new := published(text)) != text:
            page.write_text(new, encoding="utf-8")
            print(f"published {page.relative_to(ROOT)}")
    for problem in stale:
        print(problem, file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
