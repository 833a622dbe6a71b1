"""What the reproduction scripts share: their command line (`--quick`, `--output`, `--plot`, `--seed`,
`--threads`), the Markdown table they print and the JSON file they write.

Each script trains from scratch on a CPU within its stated budget, prints a table of its figures beside the paper's,
writes every figure with `--output FILE.json` and draws its plot with `--plot FILE.png` (matplotlib, the `plots`
extra). `--quick` runs the same code on tiny sizes as a smoke test: its numbers are not results.
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
import transformers

from hf_ext.extras import install_command


def reproduction_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the code, not a result")
    parser.add_argument("--output", type=Path, help="write every figure to this JSON file")
    parser.add_argument("--plot", type=Path, help="draw the figure to this PNG file (needs matplotlib)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the weights (default 0)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, one per core)")
    return parser


def start(args: argparse.Namespace) -> float:
    """Apply --threads and --seed, silence transformers' notices, print what the run is on; returns the start time."""
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), transformers {transformers.__version__}; load {load:.2f}; "
          f"{'QUICK smoke run (not a result)' if args.quick else 'full run'}; seed {args.seed}", flush=True)
    return time.perf_counter()


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table; floats with three decimals."""
    def cell(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def finish(args: argparse.Namespace, started: float, results: dict) -> dict:
    """Add the run's settings and seconds to `results`, write them to --output, and return them."""
    results = {"quick": args.quick, "seed": args.seed, "seconds": round(time.perf_counter() - started, 1),
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, **results}
    print(f"seconds: {results['seconds']}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.output}")
    return results


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
