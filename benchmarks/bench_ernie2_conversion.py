#!/usr/bin/env python
"""Converting an ERNIE-base-sized Paddle static checkpoint (`hf-ext convert ernie2`) against `torch.load` +
`safetensors` save of the same tensors.

The script writes a release folder with random weights (params/ LoDTensor files, ernie_config.json of
ERNIE_Base_en_stable-2.0.0, a 30522-token vocab.txt) and a torch checkpoint of the same tensors. Each measurement
runs in a fresh Python process (the candidates take turns), which reports the seconds of the work itself and its
peak resident memory (VmHWM), both without the imports; the whole process's peak is printed too.
Targets: time ratio <= 1.5x, conversion peak <= 1.5x the checkpoint size.
"""

import tempfile
from pathlib import Path

import torch
from timing import benchmark_parser, finish, measure_rounds, record, report_conversion, setup

from hf_ext.models.ernie2.samples import BASE_CONFIG, random_weights, sample_vocab, write_static_release

BASELINE = ("import torch\nfrom safetensors.torch import save_file",
            "save_file(torch.load(sys.argv[1], weights_only=True), sys.argv[2])")
# imports outside the clock: the conversion module, and every model's commands, which building the parser imports
CONVERSION = ("from hf_ext.cli import build_parser, main\nimport hf_ext.models.ernie2.conversion\nbuild_parser()",
              "assert main(['convert', 'ernie2', sys.argv[1], sys.argv[2], '--overwrite']) == 0")
QUICK_SIZES = {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 2, "vocab_size": 1000}


def main(argv=None):
    parser = benchmark_parser(__doc__)
    parser.add_argument("--layers", type=int, help="encoder layers (default: the base release's 12)")
    parser.add_argument("--workdir", type=Path, help="where to write the checkpoints (default: a temporary folder)")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=3)
    config = {**BASE_CONFIG, **(QUICK_SIZES if args.quick else {})}
    if args.layers:
        config["num_hidden_layers"] = args.layers

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        weights = random_weights(config)
        src = write_static_release(tmp / "ernie2_base", config, weights, sample_vocab(config["vocab_size"]))
        torch.save({name: torch.from_numpy(array) for name, array in weights.items()}, tmp / "same_tensors.bin")
        del weights
        files = list((src / "params").iterdir())
        size = sum(p.stat().st_size for p in files)
        torch_copy = (tmp / "same_tensors.bin").stat().st_size
        print(f"checkpoint: {len(files)} LoDTensor files, {size / 2**20:.1f} MiB "
              f"({config['num_hidden_layers']} layers, hidden {config['hidden_size']}); torch copy "
              f"{torch_copy / 2**20:.1f} MiB")
        record("checkpoint", {"lodtensor_files": len(files), "bytes": size, "layers": config["num_hidden_layers"],
                              "hidden_size": config["hidden_size"], "torch_copy_bytes": torch_copy})
        runs = measure_rounds({"hf-ext convert ernie2": (*CONVERSION, (src, tmp / "converted")),
                               "torch.load + safetensors save": (*BASELINE, (tmp / "same_tensors.bin",
                                                                             tmp / "baseline.safetensors"))},
                              repeats, warmup=not args.quick, section="conversion")
    report_conversion(runs, "hf-ext convert ernie2", "torch.load + safetensors save", size)
    finish()


if __name__ == "__main__":
    main()
