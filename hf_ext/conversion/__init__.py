"""Converters from the original research checkpoints. Each module offers `add_arguments(parser)` and `run(args)`
for `hf-ext convert <model>` and the matching script in `conversion/`."""

from pathlib import Path

CONVERTERS = {
    "optimus": ("hf_ext.conversion.optimus", "original Optimus checkpoints (ChunyuanLI/Optimus)"),
    "ernie2": ("hf_ext.conversion.ernie2", "ERNIE 2.0 PaddlePaddle checkpoints (static release or PaddleNLP), "
               "without paddle"),
    "mtdnn": ("hf_ext.conversion.mtdnn", "original MT-DNN checkpoints (namisan/mt-dnn)"),
    "universal-transformer": ("hf_ext.conversion.universal_transformer", "Universal Transformer checkpoints of the "
                              "PyTorch re-implementation (andreamad8/Universal-Transformer-Pytorch)"),
}


def add_output_arguments(parser):
    """The options every converter shares: the reference check, overwriting, and pushing to the Hub."""
    parser.add_argument("--reference", type=Path, help="reference.safetensors with outputs of the original code to "
                        "check the conversion against (errors go into the model card)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", help="also push the folder to this Hub repository")
    parser.add_argument("--private", action="store_true", help="create the Hub repository as private")
    parser.add_argument("--token", help="Hub token (default: the logged-in one)")


def print_parity(parity):
    """The parity errors a conversion measured, one per line on stdout."""
    for name, value in parity.items():
        print(f"{name}: max abs error {value:.3g}")
