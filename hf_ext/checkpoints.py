"""Safe reading of original research checkpoints.

`torch.load(weights_only=True)` never runs code; the allowlist below adds exactly the globals that 2019-2020
training checkpoints (Optimus' `training.bin` and args files) pickle besides tensors. Anything else is refused.
"""

import argparse
import codecs
import pickle
import re
import zipfile
from collections.abc import Callable, Collection
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


def allowed_globals() -> list:
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


def safe_torch_load(path: str | Path, what: str = "checkpoint",
                    extra_globals: Collection[Callable[..., object] | tuple[Callable[..., object], str]] = (),
                    ) -> object:
    """Load a torch checkpoint without executing code; one clear `HfExtError` line for anything that is not one.

    `extra_globals` extends the allowlist for one load, e.g. with `(stand_in, "original.module.Name")` pairs that
    map a research code base's own classes to inert stand-ins (torch's weights-only unpickler takes such pairs)."""
    path = Path(path)
    if not path.exists():
        raise HfExtError(f"{what} {path} does not exist")
    if path.is_dir():
        raise HfExtError(f"{what} {path} is a folder, expected a file")
    if path.stat().st_size == 0:
        raise HfExtError(f"{what} {path} is empty")
    with open(path, "rb") as handle:
        head = handle.read(4)
    # torch.save writes a zip archive, or (before torch 1.6) a pickle of protocol 2
    if not (head == b"PK\x03\x04" or head.startswith(b"\x80")):
        raise HfExtError(f"{what} {path} is not a torch checkpoint (neither a zip archive nor a pickle)")
    try:
        with torch.serialization.safe_globals([*allowed_globals(), *extra_globals]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        text = str(error)
        # torch words this differently by case ("Unsupported global: GLOBAL exec ...", "unsupported GLOBAL
        # posix.system whose module posix is blocked"); the GLOBAL name is the common part
        blocked = re.search(r"GLOBAL ([\w.]+)", text)
        if blocked or "Unsupported operand" in text:
            raise HfExtError(
                f"refusing to load {what} {path}: it asks to import {blocked.group(1) if blocked else 'an object'}, "
                "which a weights checkpoint never needs (the pickle could run code; it was not executed)"
            ) from None
        if "truncated" in text or "EOF" in text:
            raise HfExtError(f"{what} {path} is truncated or corrupt ({_first_line(text)})") from None
        raise HfExtError(f"{what} {path} is not a torch checkpoint ({_first_line(text)})") from None
    except (EOFError, zipfile.BadZipFile, OSError) as error:  # the file opened: an OSError here is a bad offset
        raise HfExtError(f"{what} {path} is truncated or corrupt ({type(error).__name__}: {error})") from None
    except RuntimeError as error:
        text = _first_line(str(error))
        if any(s in text for s in ("PytorchStreamReader", "unexpected EOF", "storage", "size")):
            raise HfExtError(f"{what} {path} is truncated or corrupt ({text})") from None
        raise HfExtError(f"{what} {path} could not be read as a torch checkpoint ({text})") from None
    except (ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError) as error:
        raise HfExtError(f"{what} {path} could not be read as a torch checkpoint ({type(error).__name__}: "
                         f"{_first_line(str(error))})") from None


def load_state_dict(path: str | Path, what: str = "state dict") -> dict[str, torch.Tensor]:
    """A `{name: tensor}` checkpoint, checked to be one."""
    state = safe_torch_load(path, what)
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HfExtError(f"{what} {path} is not a state dict of tensors")
    return state


def _first_line(text):
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if len(lines) == 1 else (lines[0] if lines else "")


# numpy's array reconstruction, under both module paths (numpy 1.x pickles say numpy.core, numpy 2 numpy._core)
NUMPY_ARRAY_GLOBALS = frozenset({
    *((f"{core}.multiarray", "_reconstruct") for core in ("numpy.core", "numpy._core")),
    *((f"{core}.numeric", "_frombuffer") for core in ("numpy.core", "numpy._core")),  # pickle protocol 5
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # protocol 2 pickles carry array bytes as latin-1 text
})


def _numeric_dtype(*args):
    """`numpy.dtype` for pickles, refusing object dtypes (their items would be arbitrary unpickled objects)."""
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise pickle.UnpicklingError("an object array (only numeric arrays are allowed)")
    return dtype


class _RefusedGlobal(pickle.UnpicklingError):
    pass


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that imports only the `(module, name)` pairs in `allowed` and no persistent ids; `numpy.dtype`
    comes back as `_numeric_dtype`."""

    def __init__(self, file, allowed):
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module, name):
        if (module, name) not in self.allowed:
            raise _RefusedGlobal(f"{module}.{name}")
        if (module, name) == ("numpy", "dtype"):
            return _numeric_dtype
        if module.startswith("numpy.core") and hasattr(np, "_core"):  # numpy 2 keeps numpy.core only as a shim
            module = "numpy._core" + module[len("numpy.core"):]
        return super().find_class(module, name)

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("a persistent id (not a plain pickle)")


def restricted_pickle_load(path: str | Path, allowed: Collection[tuple[str, str]], what: str = "pickle",
                           ) -> object:
    """Unpickle `path` importing only the globals in `allowed` (pairs of module and name); anything else, a truncated
    file or a non-pickle becomes one `HfExtError` line. Nothing a refused pickle asks for is executed."""
    path = Path(path)
    if not path.is_file():
        raise HfExtError(f"{what} {path} does not exist" if not path.exists() else f"{what} {path} is not a file")
    try:
        with open(path, "rb") as handle:
            if handle.read(4) == b"PK\x03\x04":
                raise HfExtError(f"{what} {path} is a zip archive (a torch checkpoint?), not a pickle")
            handle.seek(0)
            return _RestrictedUnpickler(handle, allowed).load()
    except _RefusedGlobal as error:
        raise HfExtError(f"refusing to load {what} {path}: it asks to import {error} (the pickle could run code; "
                         "it was not executed)") from None
    except EOFError:
        raise HfExtError(f"{what} {path} is truncated (the pickle ends early)") from None
    except pickle.UnpicklingError as error:
        text = _first_line(str(error))
        if "truncated" in text:
            raise HfExtError(f"{what} {path} is truncated ({text})") from None
        if text.startswith("invalid load key") or "unsupported pickle protocol" in text:
            raise HfExtError(f"{what} {path} is not a pickle ({text})") from None
        raise HfExtError(f"refusing to load {what} {path}: it holds {text}") from None
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError, OverflowError) as error:
        raise HfExtError(f"{what} {path} is corrupt ({type(error).__name__}: {_first_line(str(error))})") from None


def load_numpy_pickle(path: str | Path, what: str = "pickle") -> object:
    """A pickle of plain data and numeric numpy arrays (e.g. PaddlePaddle's .pdparams), loaded without running code."""
    return restricted_pickle_load(path, NUMPY_ARRAY_GLOBALS, what)
