"""Safe reading of original research checkpoints.

`torch.load(weights_only=True)` never runs code; the allowlist below adds exactly the globals that 2019-2020
training checkpoints (Optimus' `training.bin` and args files) pickle besides tensors. Anything else is refused.
"""

import argparse
import codecs
import pickle
import zipfile
from pathlib import Path

import numpy as np
import torch

from .errors import HfExtError


def _numpy_scalar():
    core = getattr(np, "_core", None) or np.core
    return core.multiarray.scalar


def _numpy_dtype_classes():
    dtypes = getattr(np, "dtypes", None)
    if dtypes is None:
        return []
    return [getattr(dtypes, name) for name in dir(dtypes) if name.endswith("DType")]


def allowed_globals():
    """The allowlist: argparse.Namespace, torch.device, _codecs.encode, numpy scalars and dtypes (both module paths)."""
    scalar = _numpy_scalar()
    return [
        argparse.Namespace,
        torch.device,
        codecs.encode,
        np.dtype,
        *_numpy_dtype_classes(),
        (scalar, "numpy.core.multiarray.scalar"),
        (scalar, "numpy._core.multiarray.scalar"),
    ]


def safe_torch_load(path, what="checkpoint"):
    """Load a torch checkpoint without executing code; one clear `HfExtError` line for anything that is not one."""
    path = Path(path)
    if not path.exists():
        raise HfExtError(f"{what} {path} does not exist")
    if path.is_dir():
        raise HfExtError(f"{what} {path} is a folder, expected a file")
    if path.stat().st_size == 0:
        raise HfExtError(f"{what} {path} is empty")
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        text = str(error)
        if "Unsupported global" in text or "not an allowed global" in text or "Unsupported operand" in text:
            detail = text.split("Unsupported global:")[-1].split(" was not")[0].strip() if "Unsupported global" in text else ""
            raise HfExtError(
                f"refusing to load {what} {path}: it asks to import {detail or 'an object'} that a weights checkpoint "
                "never needs (the pickle could run code; it was not executed)"
            ) from None
        if "truncated" in text or "EOF" in text:
            raise HfExtError(f"{what} {path} is truncated or corrupt ({_first_line(text)})") from None
        raise HfExtError(f"{what} {path} is not a torch checkpoint ({_first_line(text)})") from None
    except (EOFError, zipfile.BadZipFile) as error:
        raise HfExtError(f"{what} {path} is truncated or corrupt ({type(error).__name__}: {error})") from None
    except RuntimeError as error:
        text = _first_line(str(error))
        if any(s in text for s in ("PytorchStreamReader", "unexpected EOF", "storage", "size")):
            raise HfExtError(f"{what} {path} is truncated or corrupt ({text})") from None
        raise HfExtError(f"{what} {path} could not be read as a torch checkpoint ({text})") from None
    except (ValueError, TypeError, AttributeError, ImportError, OSError, IndexError, KeyError) as error:
        raise HfExtError(f"{what} {path} could not be read as a torch checkpoint ({type(error).__name__}: "
                         f"{_first_line(str(error))})") from None


def load_state_dict(path, what="state dict"):
    """A `{name: tensor}` checkpoint, checked to be one."""
    state = safe_torch_load(path, what)
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HfExtError(f"{what} {path} is not a state dict of tensors")
    return state


def _first_line(text):
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if len(lines) == 1 else (lines[0] if lines else "")
