"""What every converter shares. Each model's `conversion` module offers `add_arguments(parser)` and `run(args)`
for `hf-ext convert <model>` and the matching script in the top-level `conversion/` folder."""

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import torch

from .arguments import TOKEN_HELP, hub_token
from .errors import HfExtError, one_line


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every converter shares: the reference check, overwriting, and pushing to the Hub."""
    parser.add_argument("--reference", type=Path, help="reference.safetensors with outputs of the original code to "
                        "check the conversion against: an output beyond its tolerance fails the conversion (nothing "
                        "is written); errors and tolerances go into the model card")
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


@dataclass(frozen=True)
class Tolerance:
    """How close a converted output must come to the original's, element by element:
    |ours - theirs| <= atol + rtol * |theirs| (the rule of `torch.isclose`); atol = rtol = 0 asks for equality.
    With `infinities`, infinite values belong to the output (masked attention scores) and must sit at the same
    places with the same sign; without it, an infinite reference value is refused like NaN."""

    atol: float = 0.0
    rtol: float = 0.0
    infinities: bool = False

    def __str__(self) -> str:
        terms = [f"atol {self.atol:g}"] * bool(self.atol or self.rtol) + [f"rtol {self.rtol:g}"] * bool(self.rtol)
        return ", ".join((terms or ["exact"]) + ["infinities at the same places"] * self.infinities)


EXACT = Tolerance()

# the converted model a converter's `reference_outputs` runs (`compare_with_reference`)
ModelT = TypeVar("ModelT", bound=torch.nn.Module)


class Compared(NamedTuple):
    """One output of the converted model beside the original's, and the tolerance it is held to."""

    ours: torch.Tensor
    expected: torch.Tensor
    tolerance: Tolerance


@dataclass(frozen=True)
class ParityCheck:
    """The outcome of comparing one output: its max abs error, its tolerance, and `excess`, the largest difference
    as a multiple of what the tolerance allows at that element (above 1: beyond the tolerance)."""

    name: str
    error: float
    tolerance: Tolerance
    excess: float

    @property
    def passed(self) -> bool:
        return self.excess <= 1.0


def exact_check(name: str, error: float) -> ParityCheck:
    """A check that must find no difference at all (weights written and read back)."""
    return ParityCheck(name, error, EXACT, 0.0 if error == 0 else math.inf)


def compare_output(name: str, ours: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance,
                   source: str | Path) -> ParityCheck:
    """Compare one output of the converted model with the original's (from the reference file `source`): shapes must
    agree, a NaN (or, unless the tolerance allows them, an infinite) reference value is refused, integer outputs
    (counts, ids) compare exactly whatever the tolerance. An output that is NaN where the original is not fails."""
    ours, expected = ours.detach().cpu(), expected.detach().cpu()
    if tuple(ours.shape) != tuple(expected.shape):
        raise HfExtError(f"reference {source}: {name} has shape {list(expected.shape)}, the converted model gives "
                         f"{list(ours.shape)} (a reference of another configuration?)")
    if not (expected.is_floating_point() and ours.is_floating_point()):
        tolerance = EXACT
    ours, expected = ours.double(), expected.double()
    if expected.isnan().any():
        raise HfExtError(f"reference {source}: {name} holds NaN values")
    infinite = expected.isinf()
    if infinite.any() and not tolerance.infinities:
        raise HfExtError(f"reference {source}: {name} holds infinite values")
    if not torch.equal(ours.isinf(), infinite) or not torch.equal(ours[infinite], expected[infinite]):
        return ParityCheck(name, math.inf, tolerance, math.inf)
    difference = (ours - expected).abs()[~infinite]
    if difference.numel() == 0:
        return ParityCheck(name, 0.0, tolerance, 0.0)
    if difference.isnan().any():
        return ParityCheck(name, math.nan, tolerance, math.inf)
    allowed = tolerance.atol + tolerance.rtol * expected[~infinite].abs()
    excess = torch.where(difference == 0, 0.0, difference / allowed)  # x / 0 is inf: any difference fails "exact"
    return ParityCheck(name, difference.max().item(), tolerance, excess.max().item())


def compare_with_reference(model: ModelT, reference: dict[str, torch.Tensor], path: str | Path,
                           reference_outputs: Callable[[ModelT, dict[str, torch.Tensor]], dict[str, Compared]],
                           ) -> list[ParityCheck]:
    """Run a converter's `reference_outputs(model, reference)` (the model's outputs on the reference's inputs beside
    the original's, with their tolerances) and compare each (`compare_output`), refusing a reference of another
    model (it lacks the inputs, or compares nothing)."""
    try:
        outputs = reference_outputs(model, reference)
    except KeyError as error:
        raise HfExtError(f"reference {path} lacks the tensor {error.args[0]!r} (a reference of another model?)") \
            from None
    except (RuntimeError, ValueError, IndexError, TypeError) as error:
        raise HfExtError(f"reference {path} does not fit this model ({one_line(error)})") from None
    if not outputs:
        raise HfExtError(f"reference {path} holds none of the outputs this model is compared on (a reference of "
                         "another model?)")
    return [compare_output(name, *compared, source=path) for name, compared in outputs.items()]


def require_parity(checks: list[ParityCheck], reference: str | Path | None = None) -> None:
    """Fail the conversion (nothing is written) when a check exceeds its tolerance, naming the worst one."""
    failed = [check for check in checks if not check.passed]
    if not failed:
        return
    worst = max(failed, key=lambda check: check.excess)
    more = f" ({len(failed) - 1} more beyond their tolerance)" if len(failed) > 1 else ""
    against = f" against {reference}" if reference is not None else ""
    raise HfExtError(f"the converted model fails its parity check{against}: {worst.name}: max abs error "
                     f"{worst.error:.3g} exceeds its tolerance ({worst.tolerance}){more}; nothing was written")


def print_parity(parity: list[ParityCheck]) -> None:
    """The parity checks of a conversion, one per line on stdout: the error measured and the tolerance."""
    for check in parity:
        print(f"{check.name}: max abs error {check.error:.3g} (tolerance: {check.tolerance})")
