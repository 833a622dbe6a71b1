"""What the reproduction scripts share: their command line (`--quick`, `--output`, `--plot`, `--seeds`, `--jobs`,
`--threads`), the run over several seeds, the Markdown tables they print and the results file they write.

Each script trains from scratch on a CPU within its stated budget, once per seed (`--seeds`, three by default, in
`--jobs` processes at once), prints its tables as mean and standard deviation over the seeds beside the paper's
numbers, writes every figure of every seed with where it came from (the commit, the command, the machine) to
`--output FILE.json` and draws its plot with `--plot FILE.png` (matplotlib, the `plots` extra). `--quick` runs the
same code on tiny sizes as a smoke test: its numbers are not results.

A script defines `run(args) -> dict` (one seed, `args.seed`: its figures), `tables(results) -> str` (the Markdown
it prints and the page shows, over `results["per_seed"]`) and optionally `draw(pyplot, results, path)`, and calls
`main(parser, run, tables, draw)`.
"""

import argparse
import datetime
import multiprocessing
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import transformers

from hf_ext.extras import install_command
from hf_ext.provenance import checkout_commit, machine_description, software_versions, write_results

REPOSITORY = Path(__file__).resolve().parent.parent
DEFAULT_SEEDS = (0, 1, 2)


def reproduction_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the code, not a result")
    parser.add_argument("--output", type=Path, help="write every figure to this JSON file")
    parser.add_argument("--plot", type=Path, help="draw the figure to this PNG file (needs matplotlib)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="seeds of the data and the weights, one run each (default 0 1 2; --quick: 0)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once, one process each (default 1)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads of each run (default: torch's)")
    return parser




def start(args: argparse.Namespace) -> None:
    """Apply --threads and the run's seed, silence transformers' notices, print what the run is on."""
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"seed {args.seed}: {machine_description()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}; load {load:.2f}; "
          f"{'QUICK smoke run (not a result)' if args.quick else 'full run'}", flush=True)




def _run_seed(run: Callable[[argparse.Namespace], dict], args: argparse.Namespace, seed: int) -> dict:
    args = argparse.Namespace(**{**vars(args), "seed": seed})
    start(args)
    started = time.perf_counter()
    figures = run(args)
    seconds = round(time.perf_counter() - started, 1)
    print(f"seed {seed}: {seconds} s", flush=True)
    return {"seed": seed, "seconds": seconds, **figures}


def main(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], dict],
         tables: Callable[[dict], str], draw: Callable | None = None, argv: Sequence[str] | None = None,
         prepare: Callable[[argparse.Namespace], None] | None = None) -> dict:
    """Run `run` once per seed, print `tables` over them, write the results file and the plot; returns the results.
    `prepare` completes the parsed arguments (defaults that depend on others)."""
    args = parser.parse_args(argv)
    if prepare is not None:
        prepare(args)
    seeds = args.seeds or ([0] if args.quick else list(DEFAULT_SEEDS))
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds: a seed is given twice: {seeds}")
    pyplot = plotting(args) if draw is not None else None  # a missing matplotlib stops the run before it starts
    # the code that runs, read before the hours of work in which the checkout may change
    code = checkout_commit(REPOSITORY)
    started = time.perf_counter()
    if args.jobs > 1 and len(seeds) > 1:
        # spawned, not forked: each run starts its own torch thread pool
        with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(seeds))) as pool:
            per_seed = pool.starmap(_run_seed, [(run, args, seed) for seed in seeds])
    else:
        per_seed = [_run_seed(run, args, seed) for seed in seeds]
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPOSITORY) if script.is_relative_to(REPOSITORY) else script.name
    results = {
        "script": str(shown), "command": shlex.join(["python", str(shown), *(sys.argv[1:] if argv is None else argv)]),
        "commit": code, "date": datetime.date.today().isoformat(), "machine": machine_description(),
        "versions": software_versions(),
        "quick": args.quick, "seeds": seeds, "seconds": round(time.perf_counter() - started, 1),
        "per_seed": per_seed,
    }
    print("\n" + tables(results) + "\n")
    print(f"seconds: {results['seconds']} for {len(seeds)} seed(s)")
    if args.output:
        write_results(args.output, results)
        print(f"wrote {args.output}")
    if pyplot is not None:
        draw(pyplot, results, args.plot)
        print(f"wrote {args.plot}")
    return results


def values(results: dict, read: Callable[[dict], float]) -> list[float]:
    """One figure of every seed: `read` picks it out of a seed's results."""
    return [float(read(seed)) for seed in results["per_seed"]]


def spread(numbers: Sequence[float], digits: int = 2, scale: float = 1.0) -> str:
    """Mean ± standard deviation (over the seeds, n-1); the mean alone for one seed."""
    mean = statistics.fmean(numbers) * scale
    if len(numbers) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(numbers) * scale:.{digits}f}"


def holds(results: dict, claim: Callable[[dict], bool]) -> str:
    """In how many seeds a claim about one seed's figures holds, e.g. "3 of 3"."""
    count = sum(bool(claim(seed)) for seed in results["per_seed"])
    return f"{count} of {len(results['per_seed'])}"


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table; floats with three decimals."""
    def cell(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def plotting(args: argparse.Namespace):
    """matplotlib's pyplot when --plot is given (None otherwise); a clear exit when matplotlib is missing."""
    if args.plot is None:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise SystemExit(f"--plot needs matplotlib: {install_command('plots')}") from None
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    return pyplot
