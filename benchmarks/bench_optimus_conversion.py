#!/usr/bin/env python
"""Time and peak memory of `convert_optimus_checkpoint` on a full-size original checkpoint (BERT-base + GPT-2 small,
random weights, written in the original's on-disk format into a temporary folder), against the least any
conversion must do: `torch.load` of the same files and one `safetensors` save of their tensors.

Each measurement runs in a fresh Python process (the candidates take turns), which reports the seconds of the work
itself and its peak resident memory (VmHWM), both without the imports; the whole process's peak is printed too.
"""

import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from timing import benchmark_parser, finish, measure_rounds, record, report_conversion, setup

from hf_ext import OptimusConfig
from hf_ext.checkpoints import safe_torch_load
from hf_ext.models.optimus.conversion import find_source
from hf_ext.models.optimus.samples import random_model, tiny_config, write_original_checkpoint

SOURCES = ("split", "full")
CONVERSION = ("from hf_ext.models.optimus.conversion import convert_optimus_checkpoint",
              "convert_optimus_checkpoint(sys.argv[1], sys.argv[2])")
BASELINE = ("from bench_optimus_conversion import load_and_save", "load_and_save(sys.argv[1], sys.argv[2])")


def load_and_save(src, out):
    """The baseline: `torch.load` of the original weight files, one safetensors save of their tensors."""
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


def write_checkpoint(root, quick, source):
    """The original's files for a random-weight Optimus: split encoder/decoder folders or a full training.bin."""
    config = tiny_config(200, 300) if quick else OptimusConfig(latent_size=32)  # BERT-base + GPT-2 small
    model = random_model(config, scale=0.02)
    write_original_checkpoint(root, model, split=source == "split", full=source == "full")
    n_params = sum(p.numel() for p in model.parameters())
    files = [p for p in Path(root).rglob("*") if p.is_file()]
    return n_params, sum(p.stat().st_size for p in files)


def main(argv=None):
    parser = benchmark_parser(__doc__)
    parser.add_argument("--source", choices=SOURCES, default="split",
                        help="convert checkpoint-encoder-N/ + checkpoint-decoder-N/ (split, default) or "
                        "checkpoint-full-N/training.bin (full)")
    parser.add_argument("--workdir", type=Path, help="where to write the checkpoint (default: a temporary folder)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=3)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root, out = Path(tmp) / "original", Path(tmp) / "out"
        n_params, checkpoint_bytes = write_checkpoint(root, args.quick, args.source)
        print(f"checkpoint ({args.source}): {n_params / 1e6:.1f}M parameters, {checkpoint_bytes / 2**20:.1f} MiB")
        record("checkpoint", {"source": args.source, "parameters": n_params, "bytes": checkpoint_bytes})
        runs = measure_rounds({"convert_optimus_checkpoint": (*CONVERSION, (root, out)),
                               "torch.load + safetensors save": (*BASELINE, (root, out))},
                              repeats, warmup=not args.quick, after_each=lambda: shutil.rmtree(out),
                              section=f"conversion ({args.source})")
    report_conversion(runs, "convert_optimus_checkpoint", "torch.load + safetensors save", checkpoint_bytes)
    finish()


if __name__ == "__main__":
    main()
