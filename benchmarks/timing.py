"""Timing shared by the benchmark scripts: warm-up, interleaved repeats, medians and the report lines."""

import argparse
import os
import platform
import statistics
import time

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


def time_interleaved(candidates, repeats, warmup=1):
    """Seconds of each run of every `{name: callable}`. The candidates take turns within every round, so load that
    comes and goes affects the runs of one round alike."""
    for run in candidates.values():
        for _ in range(warmup):
            run()
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"  {name}: median {statistics.median(values):.3f} s, min {min(values):.3f} s "
              f"(runs: {', '.join(f'{v:.3f}' for v in values)})")
    print(f"  ({load_average()})")
    return times


def report_ratio(label, numerator, denominator, target, higher_is_better=False):
    """One result line for `numerator / denominator` (lists of seconds from the same rounds). The headline is the
    median of the per-round ratios; the ratios of the medians and of the minimums are printed beside it."""
    paired = statistics.median(n / d for n, d in zip(numerator, denominator))
    met = paired >= target if higher_is_better else paired <= target
    sign = ">=" if higher_is_better else "<="
    print(f"RESULT {label}: {paired:.2f}x (target {sign} {target}x: {'met' if met else 'MISSED'}; ratio of medians "
          f"{statistics.median(numerator) / statistics.median(denominator):.2f}x, of minimums "
          f"{min(numerator) / min(denominator):.2f}x)")
    return met
