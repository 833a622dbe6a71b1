#!/usr/bin/env python
"""Time and peak memory of `convert_optimus_checkpoint` on a full-size original checkpoint (BERT-base + GPT-2 small,
random weights, written in the original's on-disk format into a temporary folder), against the least any
conversion must do: `torch.load` of the same files and one `safetensors` save of their tensors.

Each measurement runs in a fresh Python process (the candidates take turns), which reports the seconds of the work
itself (imports excluded) and its peak resident memory (VmHWM) after imports and at the end.
"""

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCES = ("split", "full")


def rss_status():
    """Current and peak resident set size of this process, in bytes (Linux /proc)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def worker(kind, src, out):
    """Run one candidate in this (fresh) process and print its measurement as JSON."""
    import time

    import torch
    from safetensors.torch import save_file

    from hf_ext.checkpoints import safe_torch_load
    from hf_ext.conversion.optimus import convert_optimus_checkpoint, find_source

    rss_after_imports, _ = rss_status()
    start = time.perf_counter()
    if kind == "convert":
        convert_optimus_checkpoint(src, out)
    else:
        source = find_source(src)
        if source.full_checkpoint is not None:
            state = safe_torch_load(source.full_checkpoint)["model_state_dict"]
        else:
            state = {f"{side}.{name}": tensor
                     for side, folder in (("encoder", source.encoder_dir), ("decoder", source.decoder_dir))
                     for name, tensor in torch.load(folder / "pytorch_model.bin", weights_only=True).items()}
        stored = {}
        for name, tensor in state.items():  # tied and shared tensors are stored once, as any conversion must
            stored.setdefault(tensor.untyped_storage().data_ptr(), (name, tensor))
        Path(out).mkdir()
        save_file(dict(stored.values()), Path(out) / "model.safetensors")
    seconds = time.perf_counter() - start
    _, peak = rss_status()
    print(json.dumps({"seconds": seconds, "peak": peak, "rss_after_imports": rss_after_imports}))


def measure(kind, src, out):
    result = subprocess.run([sys.executable, __file__, "--worker", kind, str(src), str(out)],
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{kind} failed:\n{result.stderr}")
    shutil.rmtree(out)
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_checkpoint(root, quick, source):
    """The original's files for a random-weight Optimus: split encoder/decoder folders or a full training.bin."""
    from hf_ext import OptimusConfig
    from hf_ext.samples import random_model, tiny_config, write_original_checkpoint

    config = tiny_config(200, 300) if quick else OptimusConfig(latent_size=32)  # BERT-base + GPT-2 small
    model = random_model(config, scale=0.02)
    write_original_checkpoint(root, model, split=source == "split", full=source == "full")
    n_params = sum(p.numel() for p in model.parameters())
    files = [p for p in Path(root).rglob("*") if p.is_file()]
    return n_params, sum(p.stat().st_size for p in files)


def main(argv=None):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from timing import benchmark_parser, report_ratio, setup

    parser = benchmark_parser(__doc__)
    parser.add_argument("--source", choices=SOURCES, default="split",
                        help="convert checkpoint-encoder-N/ + checkpoint-decoder-N/ (split, default) or "
                        "checkpoint-full-N/training.bin (full)")
    parser.add_argument("--workdir", type=Path, help="where to write the checkpoint (default: a temporary folder)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=3)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp) / "original"
        n_params, checkpoint_bytes = write_checkpoint(root, args.quick, args.source)
        print(f"checkpoint ({args.source}): {n_params / 1e6:.1f}M parameters, {checkpoint_bytes / 2**20:.1f} MiB")
        runs = {"convert_optimus_checkpoint": [], "torch.load + safetensors save": []}
        kinds = {"convert_optimus_checkpoint": "convert", "torch.load + safetensors save": "copy"}
        for kind in kinds.values():  # warm-up: the page cache holds the checkpoint for every timed run
            measure(kind, root, Path(tmp) / "out")
        for _ in range(repeats):
            for name, kind in kinds.items():
                runs[name].append(measure(kind, root, Path(tmp) / "out"))
    for name, results in runs.items():
        peak = statistics.median(r["peak"] for r in results)
        after_imports = statistics.median(r["rss_after_imports"] for r in results)
        seconds = ", ".join(f"{r['seconds']:.2f}" for r in results)
        print(f"  {name}: seconds {seconds}; peak RSS "
              f"{peak / 2**20:.0f} MiB = {peak / checkpoint_bytes:.2f}x the checkpoint (RSS after imports "
              f"{after_imports / 2**20:.0f} MiB; peak above that {(peak - after_imports) / checkpoint_bytes:.2f}x)")
    converter, baseline = runs["convert_optimus_checkpoint"], runs["torch.load + safetensors save"]
    report_ratio("conversion time / (torch.load + safetensors save)", [r["seconds"] for r in converter],
                 [r["seconds"] for r in baseline], 1.5)
    report_ratio("conversion peak RSS / checkpoint size", [r["peak"] for r in converter],
                 [checkpoint_bytes] * len(converter), 1.5)
    report_ratio("(for comparison, not a target) baseline peak RSS / checkpoint size", [r["peak"] for r in baseline],
                 [checkpoint_bytes] * len(baseline), 1.5)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
    else:
        main()
