"""What every converter shares. Each model's `conversion` module offers `add_arguments(parser)` and `run(args)`
for `hf-ext convert <model>` and the matching script in the top-level `conversion/` folder."""

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch

from .arguments import TOKEN_HELP, hub_token
from .errors import HfExtError, one_line


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every converter shares: the reference check, overwriting, and pushing to the Hub."""
    parser.add_argument("--reference", type=Path, help="reference.safetensors with outputs of the original code to "
                        "check the conversion against (errors go into the model card)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", help="also push the folder to this Hub repository")
    parser.add_argument("--private", action="store_true", help="create the Hub repository as private")
    parser.add_argument("--token", type=hub_token, help=TOKEN_HELP)


def load_reference(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a `--reference` file (outputs of the original code), read before any work starts."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise HfExtError(f"reference {path} is not a .safetensors file")
    if not path.is_file():
        raise HfExtError(f"reference {path} {'is not a file' if path.exists() else 'does not exist'}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise HfExtError(f"reference {path} is not a readable safetensors file ({one_line(error)})") \
            from None
    if not tensors:
        raise HfExtError(f"reference {path} holds no tensors")
    return tensors


def compare_with_reference(model: torch.nn.Module, reference: dict[str, torch.Tensor], path: str | Path,
                           reference_errors: Callable[[torch.nn.Module, dict], dict[str, float]]) -> dict[str, float]:
    """`reference_errors(model, reference)` of a converter, refusing a reference of another model (it lacks the
    inputs, or compares nothing) and an error that is NaN (NaN in the reference: it would pass every tolerance)."""
    try:
        errors = reference_errors(model, reference)
    except KeyError as error:
        raise HfExtError(f"reference {path} lacks the tensor {error.args[0]!r} (a reference of another model?)") \
            from None
    except (RuntimeError, ValueError, IndexError, TypeError) as error:
        raise HfExtError(f"reference {path} does not fit this model ({one_line(error)})") from None
    if not errors:
        raise HfExtError(f"reference {path} holds none of the outputs this model is compared on (a reference of "
                         "another model?)")
    undefined = [name for name, value in errors.items() if math.isnan(value)]
    if undefined:
        raise HfExtError(f"reference {path}: the comparison of {', '.join(undefined)} gives NaN (the reference holds "
                         "NaN values)")
    return errors


def print_parity(parity: dict[str, float]) -> None:
    """The parity errors a conversion measured, one per line on stdout."""
    for name, value in parity.items():
        print(f"{name}: max abs error {value:.3g}")
