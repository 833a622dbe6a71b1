"""Timing shared by the benchmark scripts: warm-up, interleaved repeats, medians and the report lines."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers


def benchmark_parser(description):
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repeats: a smoke run, not a result")
    parser.add_argument("--repeats", type=int, help="timed rounds after the warm-up (medians are reported)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, one per core)")
    return parser


def setup(args, default_repeats, quick_repeats=1):
    """Apply --threads, choose the repeat count and print what the run measures on."""
    transformers.logging.set_verbosity_error()  # load reports and loss-type notices are not results
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (quick_repeats if args.quick else default_repeats)
    if repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); {'QUICK smoke run' if args.quick else 'full size'}; "
          f"{repeats} timed round(s) after warm-up; {load_average()}")
    return repeats


def load_average():
    """Other processes on the machine distort timings; the load average makes that visible in the output."""
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def trainer_step(trainer, inputs):
    """A function running one optimizer step of `trainer` (a transformers `Trainer` with its optimizer created) on
    `inputs`: `Trainer.training_step` without the bookkeeping of a running `train()`."""
    def run():
        loss = trainer.compute_loss(trainer.model, dict(inputs))
        trainer.accelerator.backward(loss)
        trainer.optimizer.step()
        trainer.model.zero_grad(set_to_none=True)
    return run


def time_interleaved(candidates, repeats, warmup=1, settle=0.0):
    """Seconds of each run of every `{name: callable}`. The candidates take turns within every round, so load that
    comes and goes affects the runs of one round alike. `settle` seconds of sleep before each run let thread pools
    that spin after their work (OpenMP's, ONNX Runtime's) go idle, so that they take no cycles from the next
    candidate when the candidates use different pools."""
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


def measure_rounds(candidates, repeats, warmup=1, after_each=None):
    """`{name: [measurement]}` of `measure_in_subprocess` runs: every candidate `{name: (setup, work, argv)}` once
    per round, taking turns, after `warmup` untimed rounds (they put the sources in the page cache).
    `after_each()` runs after every run (e.g. to remove its output)."""
    runs = {name: [] for name in candidates}
    for round_index in range(warmup + repeats):
        for name, (setup_code, work, argv) in candidates.items():
            result = measure_in_subprocess(setup_code, work, *argv)
            if round_index >= warmup:
                runs[name].append(result)
            if after_each is not None:
                after_each()
    return runs


def report_conversion(runs, conversion, baseline, checkpoint_bytes, target=1.5):
    """The result lines of a conversion benchmark from the `measure_rounds` runs of the `conversion` and the
    `baseline` (names): the seconds and memory of both, the time ratio and the conversion's peak memory against the
    checkpoint size (above the imports, the target; and of the whole process)."""
    converted, copied = runs[conversion], runs[baseline]
    for name in (conversion, baseline):
        above = statistics.median(run["peak"] - run["rss_before"] for run in runs[name])
        whole = statistics.median(run["peak"] for run in runs[name])
        seconds = ", ".join(f"{run['seconds']:.2f}" for run in runs[name])
        print(f"  {name}: seconds {seconds}; peak RSS above the imports {above / 2**20:.0f} MiB = "
              f"{above / checkpoint_bytes:.2f}x the checkpoint; whole process {whole / 2**20:.0f} MiB = "
              f"{whole / checkpoint_bytes:.2f}x")
    sizes = [checkpoint_bytes] * len(converted)
    report_ratio(f"conversion time / ({baseline})", [r["seconds"] for r in converted],
                 [r["seconds"] for r in copied], target)
    report_ratio("conversion peak RSS above the imports / checkpoint size",
                 [r["peak"] - r["rss_before"] for r in converted], sizes, target)
    report_ratio("(for comparison) whole-process peak RSS of the conversion / checkpoint size",
                 [r["peak"] for r in converted], sizes)


def report_ratio(label, numerator, denominator, target=None, higher_is_better=False):
    """One result line for `numerator / denominator` (lists of seconds from the same rounds). The headline is the
    median of the per-round ratios; the ratios of the medians and of the minimums are printed beside it. Without a
    `target` the line is a comparison only."""
    paired = statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))
    if target is None:
        verdict, met = "no target", None
    else:
        met = paired >= target if higher_is_better else paired <= target
        verdict = f"target {'>=' if higher_is_better else '<='} {target}x: {'met' if met else 'MISSED'}"
    print(f"RESULT {label}: {paired:.3f}x ({verdict}; ratio of medians "
          f"{statistics.median(numerator) / statistics.median(denominator):.3f}x, of minimums "
          f"{min(numerator) / min(denominator):.3f}x)")
    return met
