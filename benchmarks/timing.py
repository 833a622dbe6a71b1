"""Timing shared by the benchmark scripts: warm-up, interleaved repeats, medians, the report lines and the run's
record.

`setup` starts a record of the run (the script, the command, the commit, the machine, the versions); the timing and
report functions add every figure they print to it, a script adds its own with `record`, and `finish` writes it to
`--output FILE.json`, from which `tables` makes the Markdown of a docs page. Its keys:

- script, command, commit, date, machine, versions {python, torch, transformers}, threads, quick, repeats,
  load_average_at_start [1, 5, 15 minutes]: where the figures came from;
- ratios: one row per RESULT line {label, ratio (median of the per-round ratios), ratio_of_medians,
  ratio_of_minimums, target, higher_is_better, met};
- timings: {section: {seconds: {candidate: [seconds per round]}, load_average_at_end}}, and for the runs of
  `measure_rounds` also rss_before and peak: {candidate: [bytes per round]};
- memory (conversion benchmarks): {checkpoint_bytes, peak_rss: {candidate: {above_imports_bytes,
  above_imports_per_checkpoint, whole_process_bytes, whole_process_per_checkpoint}}}, medians over the rounds;
- figures: {key: value}, the script's own (`record`);
- seconds: the whole run's.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from hf_ext.provenance import checkout_commit, machine_description, software_versions, write_results

REPOSITORY = Path(__file__).resolve().parent.parent


def benchmark_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repeats: a smoke run, not a result")
    parser.add_argument("--repeats", type=int, help="timed rounds after the warm-up (medians are reported)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, one per core)")
    parser.add_argument("--output", type=Path, metavar="FILE.json",
                        help="write every figure of the run, with where it came from, to this JSON file")
    return parser


@dataclass
class Run:
    """The run in progress: its record, where `finish` writes it and when it started."""
    record: dict
    output: Path | None
    started: float


_run: Run | None = None  # started by setup()


def setup(args: argparse.Namespace, default_repeats: int, quick_repeats: int = 1) -> int:
    """Apply --threads, choose the repeat count, print what the run measures on and start the run's record."""
    global _run
    transformers.logging.set_verbosity_error()  # load reports and loss-type notices are not results
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (quick_repeats if args.quick else default_repeats)
    if repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); {'QUICK smoke run' if args.quick else 'full size'}; "
          f"{repeats} timed round(s) after warm-up; {load_average()}")
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPOSITORY).as_posix() if script.is_relative_to(REPOSITORY) else script.name
    record = {
        "script": shown, "command": shlex.join(["python", shown, *sys.argv[1:]]),
        "commit": checkout_commit(REPOSITORY),  # read now: the checkout may change during a long run
        "date": datetime.date.today().isoformat(), "machine": machine_description(),
        "versions": software_versions(),
        "threads": torch.get_num_threads(), "quick": args.quick, "repeats": repeats,
        "load_average_at_start": load_averages(), "ratios": [], "timings": {}, "figures": {},
    }
    _run = Run(record, args.output, time.perf_counter())
    return repeats






def load_averages() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def load_average() -> str:
    """Other processes on the machine distort timings; the load average makes that visible in the output."""
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def _record() -> dict:
    if _run is None:
        raise RuntimeError("setup() starts the run's record; call it first")
    return _run.record


def _section(name: str | None) -> dict:
    """A new timed section of the record, named `name` or numbered."""
    timings = _record()["timings"]
    name = name or str(len(timings) + 1)
    if name in timings:
        raise ValueError(f"timed section {name!r} recorded twice")
    timings[name] = {}
    return timings[name]


def record(key: str, value: object) -> None:
    """Add one of the script's own figures (JSON-serialisable) to the run's record."""
    figures = _record()["figures"]
    if key in figures:
        raise ValueError(f"figure {key!r} recorded twice")
    json.dumps(value)  # a value the results file cannot hold fails here, not when the run is over
    figures[key] = value


def finish() -> dict:
    """Add the run's total seconds to its record and write it to --output (when given). Returns the record."""
    results = _record()
    results["seconds"] = round(time.perf_counter() - _run.started, 1)
    if _run.output is not None:
        write_results(_run.output, results)
        print(f"wrote {_run.output}")
    return results


def trainer_step(trainer, inputs):
    """A function running one optimizer step of `trainer` (a transformers `Trainer` with its optimizer created) on
    `inputs`: `Trainer.training_step` without the bookkeeping of a running `train()`."""
    def run():
        loss = trainer.compute_loss(trainer.model, dict(inputs))
        trainer.accelerator.backward(loss)
        trainer.optimizer.step()
        trainer.model.zero_grad(set_to_none=True)
    return run


def time_interleaved(candidates: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                     settle: float = 0.0, section: str | None = None) -> dict[str, list[float]]:
    """Seconds of each run of every `{name: callable}`. The candidates take turns within every round, so load that
    comes and goes affects the runs of one round alike. `settle` seconds of sleep before each run let thread pools
    that spin after their work (OpenMP's, ONNX Runtime's) go idle, so that they take no cycles from the next
    candidate when the candidates use different pools. The record holds the runs under `section`, what was timed
    (e.g. "batch 1 x 128")."""
    for run in candidates.values():
        for _ in range(warmup):
            run()
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            time.sleep(settle)
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"  {name}: median {statistics.median(values):.3f} s, min {min(values):.3f} s "
              f"(runs: {', '.join(f'{v:.3f}' for v in values)})")
    print(f"  ({load_average()})")
    _section(section).update(seconds=times, load_average_at_end=load_averages())
    return times


# the script a fresh interpreter runs for `measure_in_subprocess`; only `work` is measured
MEASURED_SCRIPT = """
import json, sys, time
sys.path.insert(0, {benchmarks!r})
{setup}
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)
open("/proc/self/clear_refs", "w").write("5")  # VmHWM restarts from the current RSS: the imports are not counted
before = status("VmRSS")
start = time.perf_counter()
{work}
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "rss_before": before, "peak": status("VmHWM")}}))
"""


def measure_in_subprocess(setup, work, *argv):
    """Run `setup` then `work` (Python source; `sys.argv[1:]` is `argv`) in a fresh interpreter. Returns the
    seconds of `work`, the RSS before it (interpreter and imports) and the process's peak RSS during it (Linux)."""
    script = MEASURED_SCRIPT.format(benchmarks=str(Path(__file__).resolve().parent), setup=setup, work=work)
    result = subprocess.run([sys.executable, "-c", script, *map(str, argv)], capture_output=True, text=True,
                            check=False)
    if result.returncode:
        raise SystemExit(f"benchmark subprocess failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_rounds(candidates: dict[str, tuple[str, str, tuple]], repeats: int, warmup: int = 1,
                   after_each: Callable[[], object] | None = None, section: str | None = None) -> dict[str, list]:
    """`{name: [measurement]}` of `measure_in_subprocess` runs: every candidate `{name: (setup, work, argv)}` once
    per round, taking turns, after `warmup` untimed rounds (they put the sources in the page cache).
    `after_each()` runs after every run (e.g. to remove its output). The record holds the runs under `section`."""
    runs = {name: [] for name in candidates}
    for round_index in range(warmup + repeats):
        for name, (setup_code, work, argv) in candidates.items():
            result = measure_in_subprocess(setup_code, work, *argv)
            if round_index >= warmup:
                runs[name].append(result)
            if after_each is not None:
                after_each()
    _section(section).update({field: {name: [run[field] for run in measured] for name, measured in runs.items()}
                              for field in ("seconds", "rss_before", "peak")}, load_average_at_end=load_averages())
    return runs


def report_conversion(runs: dict[str, list], conversion: str, baseline: str, checkpoint_bytes: int,
                      target: float = 1.5) -> None:
    """The result lines of a conversion benchmark from the `measure_rounds` runs of the `conversion` and the
    `baseline` (names): the seconds and memory of both, the time ratio and the conversion's peak memory against the
    checkpoint size (above the imports, the target; and of the whole process)."""
    converted, copied = runs[conversion], runs[baseline]
    peak_rss = {}
    for name in (conversion, baseline):
        above = statistics.median(run["peak"] - run["rss_before"] for run in runs[name])
        whole = statistics.median(run["peak"] for run in runs[name])
        seconds = ", ".join(f"{run['seconds']:.2f}" for run in runs[name])
        print(f"  {name}: seconds {seconds}; peak RSS above the imports {above / 2**20:.0f} MiB = "
              f"{above / checkpoint_bytes:.2f}x the checkpoint; whole process {whole / 2**20:.0f} MiB = "
              f"{whole / checkpoint_bytes:.2f}x")
        peak_rss[name] = {"above_imports_bytes": above, "above_imports_per_checkpoint": above / checkpoint_bytes,
                          "whole_process_bytes": whole, "whole_process_per_checkpoint": whole / checkpoint_bytes}
    _record()["memory"] = {"checkpoint_bytes": checkpoint_bytes, "peak_rss": peak_rss}
    sizes = [checkpoint_bytes] * len(converted)
    report_ratio(f"conversion time / ({baseline})", [r["seconds"] for r in converted],
                 [r["seconds"] for r in copied], target)
    report_ratio("conversion peak RSS above the imports / checkpoint size",
                 [r["peak"] - r["rss_before"] for r in converted], sizes, target)
    report_ratio("(for comparison) whole-process peak RSS of the conversion / checkpoint size",
                 [r["peak"] for r in converted], sizes)


def report_ratio(label: str, numerator: list[float], denominator: list[float], target: float | None = None,
                 higher_is_better: bool = False) -> bool | None:
    """One result line for `numerator / denominator` (lists of seconds from the same rounds). The headline is the
    median of the per-round ratios; the ratios of the medians and of the minimums are printed beside it. Without a
    `target` the line is a comparison only. Returns whether the target is met (None without one)."""
    paired = statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))
    of_medians = statistics.median(numerator) / statistics.median(denominator)
    of_minimums = min(numerator) / min(denominator)
    if target is None:
        verdict, met = "no target", None
    else:
        met = paired >= target if higher_is_better else paired <= target
        verdict = f"target {'>=' if higher_is_better else '<='} {target}x: {'met' if met else 'MISSED'}"
    print(f"RESULT {label}: {paired:.3f}x ({verdict}; ratio of medians {of_medians:.3f}x, of minimums "
          f"{of_minimums:.3f}x)")
    _record()["ratios"].append({"label": label, "ratio": paired, "ratio_of_medians": of_medians,
                                "ratio_of_minimums": of_minimums, "target": target,
                                "higher_is_better": higher_is_better, "met": met})
    return met


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def compact(value: object) -> str:
    """A recorded figure on one line: floats to 4 significant digits, JSON's words for true, false and null."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {compact(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(compact(item) for item in value) + "]"
    return str(value)


def tables(results: dict) -> str:
    """The Markdown of a docs page for one results file: the RESULT lines, each timed section's runs, the memory of
    a conversion and the script's own figures. A script may define its own `tables(results)` to replace or extend
    this one; the docs use the script's when it has one."""
    def ratio(value):
        return f"{value:.3f}x"

    rows = [[row["label"], ratio(row["ratio"]),
             "" if row["target"] is None else f"{'>=' if row['higher_is_better'] else '<='} {row['target']}x",
             "" if row["met"] is None else "met" if row["met"] else "MISSED",
             ratio(row["ratio_of_medians"]), ratio(row["ratio_of_minimums"])] for row in results["ratios"]]
    parts = [markdown_table(["result", "ratio", "target", "verdict", "ratio of medians", "ratio of minimums"], rows)]
    for name, section in results["timings"].items():
        load = " ".join(f"{value:.2f}" for value in section["load_average_at_end"])
        runs = [[candidate, f"{statistics.median(seconds):.3f}", f"{min(seconds):.3f}",
                 ", ".join(f"{value:.3f}" for value in seconds)] for candidate, seconds in section["seconds"].items()]
        parts.append(f"**{name}** (load average at its end {load}):\n\n"
                     + markdown_table(["candidate", "median (s)", "min (s)", "runs (s)"], runs))
    if "memory" in results:
        checkpoint = results["memory"]["checkpoint_bytes"]
        rows = [[candidate, f"{peak['above_imports_bytes'] / 2**20:.0f}", ratio(peak["above_imports_per_checkpoint"]),
                 f"{peak['whole_process_bytes'] / 2**20:.0f}", ratio(peak["whole_process_per_checkpoint"])]
                for candidate, peak in results["memory"]["peak_rss"].items()]
        parts.append(f"Peak RSS, medians over the rounds; checkpoint {checkpoint / 2**20:.1f} MiB:\n\n"
                     + markdown_table(["candidate", "above the imports (MiB)", "/ checkpoint",
                                       "whole process (MiB)", "/ checkpoint"], rows))
    if results["figures"]:
        parts.append("\n".join(f"- {key}: {compact(value)}" for key, value in results["figures"].items()))
    return "\n\n".join(parts)
