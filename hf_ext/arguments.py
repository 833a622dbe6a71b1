"""Argparse `type=` validators: a value out of range is a usage error (exit 2) naming the option, before any work
starts. NaN and infinities are refused everywhere: no option here means them. A Hub token with whitespace or a
control character in it is refused too, without showing it."""

import argparse
import math
import unicodedata
from collections.abc import Callable
from pathlib import Path


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") \
            from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def number_in(kind: type, low: float, high: float | None = None, low_open: bool = False, high_open: bool = False,
              description: str | None = None) -> Callable[[str], float | int]:
    """A validator for `kind` values (int or float) in [low, high]; `low_open`/`high_open` leave an end out;
    `high=None` is unbounded."""
    bounds = description or (f"at least {low:g}" if high is None and kind is int and not low_open
                             else f"{'>' if low_open else '>='} {low:g}" if high is None
                             else f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}")

    def parse(text: str) -> float | int:
        value = _number(text, kind)
        if (value <= low if low_open else value < low) or (
                high is not None and (value >= high if high_open else value > high)):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


positive_int = number_in(int, 1, description="at least 1")
positive_float = number_in(float, 0, low_open=True, description="> 0")
nonnegative_float = number_in(float, 0)
nonnegative_int = number_in(int, 0)
probability = number_in(float, 0, 1, low_open=True)
fraction = number_in(float, 0, 1, high_open=True)  # [0, 1): a share of the steps, a dropout rate


TOKEN_HELP = ("Hub token (default: HF_TOKEN, or the one `hf auth login` saved; prefer those: a token given here shows "
              "in the process list and the shell's history)")


def existing_folder(text: str) -> str:
    """A folder that exists (a local input no Hub id can stand for)."""
    if not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"no folder named {text}")
    return text


def hub_token(text: str) -> str:
    """A `--token` value, refused when it is empty or holds whitespace or a control character (a line ending copied
    from a file would otherwise reach an HTTP header, whose error quotes it). The message never shows the token."""
    if not text:
        raise argparse.ArgumentTypeError("the token is empty")
    if any(character.isspace() or unicodedata.category(character).startswith("C") for character in text):
        raise argparse.ArgumentTypeError("the token holds whitespace or a control character (a line ending read "
                                         "from a file?); it is not shown here. Set HF_TOKEN or run `hf auth login` "
                                         "instead")
    return text


def sentence(text: str) -> str:
    """A sentence to encode, refused when it is empty or only whitespace: there would be nothing to encode, and the
    decoder would still "reconstruct" something from the prior's neighbourhood."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty sentence")
    return text


DEVICES = "cpu, cuda, cuda:N, mps or auto"


def device(text: str) -> str:
    """A `--device` value: cpu, cuda, cuda:N, mps, or auto (cuda when torch finds a CUDA device, else cpu), refused
    when this machine has no such device, so that the command stops before any weights are read. Returns the device
    as torch names it, auto resolved."""
    import torch

    name = text.strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        chosen = torch.device(name)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {DEVICES}, got {text!r}") from None
    if chosen.type == "cpu" and chosen.index is None:
        return "cpu"
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            built = "built without CUDA" if torch.version.cuda is None \
                else f"CUDA {torch.version.cuda}, no device found"
            raise argparse.ArgumentTypeError(f"{name}: CUDA is not available on this machine (torch "
                                             f"{torch.__version__}, {built})")
        count = torch.cuda.device_count()
        if chosen.index is not None and chosen.index >= count:
            raise argparse.ArgumentTypeError(f"{name}: this machine has {count} CUDA device{'s' if count > 1 else ''} "
                                             f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
        return name
    if chosen.type == "mps" and chosen.index is None:
        if not torch.backends.mps.is_available():
            raise argparse.ArgumentTypeError("mps: MPS is not available on this machine (Apple silicon only)")
        return "mps"
    raise argparse.ArgumentTypeError(f"expected {DEVICES}, got {text!r}")


def report_targets(text: str) -> list[str]:
    """A `--report-to` value: comma-separated names of the experiment trackers `Trainer` knows (`all` for every
    installed one, `none` for none)."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    names = [name.strip() for name in text.split(",") if name.strip()]
    known = ("all", "none", *INTEGRATION_TO_CALLBACK)
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown tracker {(unknown or [text])[0]!r} (Trainer knows: "
                                         f"{', '.join(known)})")
    return [] if names == ["none"] else names
