#!/usr/bin/env python
"""Benchmark: converting an ERNIE-base-sized Paddle static checkpoint vs torch.load + safetensors save of the same
tensors.

The script writes a release folder with random weights (params/ LoDTensor files, ernie_config.json of
ERNIE_Base_en_stable-2.0.0, a 30522-token vocab.txt) and a torch checkpoint of the same tensors, then runs, each in a
fresh subprocess and alternating, `hf-ext convert ernie2` and `torch.load` + `safetensors.torch.save_file`.
Work is timed after the imports; peak memory is the process's RSS high-water mark during the work (VmHWM, reset
after the imports) minus its RSS before the work, and also reported as the whole process's peak. Targets: time
ratio <= 1.5, conversion peak <= 1.5x the checkpoint size.

    python benchmarks/bench_ernie2_conversion.py [--repeats 3] [--layers 12] [--workdir DIR]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hf_ext.samples_ernie2 import BASE_CONFIG, random_weights, sample_vocab, write_static_release

# runs inside each subprocess: `work` is the measured statement, everything before it is set-up
MEASURE = """
import json, sys, time
{setup}
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
before = status("VmRSS")
start = time.perf_counter()
{work}
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "rss_before": before, "peak": status("VmHWM")}}))
"""

BASELINE = {"setup": "import torch\nfrom safetensors.torch import save_file",
            "work": "save_file(torch.load(sys.argv[1], weights_only=True), sys.argv[2])"}
CONVERSION = {"setup": "from hf_ext.cli import main\nimport hf_ext.conversion.ernie2",  # imports outside the clock
              "work": "assert main(['convert', 'ernie2', sys.argv[1], sys.argv[2], '--overwrite']) == 0"}


def measure(kind, src, out):
    wall = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", MEASURE.format(**kind), str(src), str(out)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"benchmark subprocess failed:\n{result.stderr}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["wall"] = time.perf_counter() - wall
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (medians are compared)")
    parser.add_argument("--layers", type=int, default=BASE_CONFIG["num_hidden_layers"], help="encoder layers")
    parser.add_argument("--workdir", type=Path, help="where to write the checkpoints (default: a temporary folder)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        config = {**BASE_CONFIG, "num_hidden_layers": args.layers}
        weights = random_weights(config)
        src = write_static_release(tmp / "ernie2_base", config, weights, sample_vocab(config["vocab_size"]))
        torch.save({name: torch.from_numpy(array) for name, array in weights.items()}, tmp / "same_tensors.bin")
        del weights
        size = sum(p.stat().st_size for p in (src / "params").iterdir())
        print(f"checkpoint: {len(list((src / 'params').iterdir()))} LoDTensor files, {size / 2**20:.1f} MiB "
              f"({args.layers} layers, hidden {config['hidden_size']}); torch copy "
              f"{(tmp / 'same_tensors.bin').stat().st_size / 2**20:.1f} MiB")

        runs = {"baseline": [], "conversion": []}
        for _ in range(args.repeats):
            runs["baseline"].append(measure(BASELINE, tmp / "same_tensors.bin", tmp / "baseline.safetensors"))
            runs["conversion"].append(measure(CONVERSION, src, tmp / "converted"))

    def median(side, key):
        return statistics.median(run[key] for run in runs[side])

    print(f"{'':12} {'work s':>8} {'proc wall s':>12} {'peak-before MiB':>16} {'process peak MiB':>17}")
    for side in runs:
        work_peak = max(run["peak"] - run["rss_before"] for run in runs[side])
        print(f"{side:12} {median(side, 'seconds'):8.2f} {median(side, 'wall'):12.2f} {work_peak / 2**20:16.1f} "
              f"{max(run['peak'] for run in runs[side]) / 2**20:17.1f}")
    time_ratio = median("conversion", "seconds") / median("baseline", "seconds")
    memory_ratio = max(run["peak"] - run["rss_before"] for run in runs["conversion"]) / size
    baseline_memory = max(run["peak"] - run["rss_before"] for run in runs["baseline"]) / size
    print(f"time ratio conversion / (torch.load + save_file): {time_ratio:.2f} (target <= 1.5) "
          f"{'OK' if time_ratio <= 1.5 else 'MISSED'}")
    print(f"conversion peak memory / checkpoint size: {memory_ratio:.2f} (target <= 1.5) "
          f"{'OK' if memory_ratio <= 1.5 else 'MISSED'}; baseline: {baseline_memory:.2f}")


if __name__ == "__main__":
    main()
