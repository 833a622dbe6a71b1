"""Atomic output folders: work happens in a temporary sibling folder that is renamed into place only on success."""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .errors import HfExtError


def check_output_dir(out, overwrite=False):
    """Refuse an existing OUT (unless `overwrite`) or one whose parent cannot be written, before any work starts."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise HfExtError(f"output {out} already exists (pass --overwrite to replace it)")
    if out.exists() and not out.is_dir():
        raise HfExtError(f"output {out} exists and is not a folder")
    parent = out.absolute().parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise HfExtError(f"output {out} cannot be created: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise HfExtError(f"output {out} is not writable ({probe} does not accept new files)")
    return out


@contextlib.contextmanager
def atomic_output_dir(out, overwrite=False):
    """Yield a temporary folder beside `out`; on success it replaces `out`, on any failure it is removed (with the
    parent folders this call created)."""
    out = check_output_dir(out, overwrite)
    parent = out.absolute().parent
    # the highest missing ancestor: on failure it goes, with everything this call made below it
    topmost_created = next((p for p in reversed([parent, *parent.parents]) if not p.exists()), None)
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=parent))
    try:
        yield staging
        if out.exists():
            backup = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.replace(out, backup / out.name)
            os.replace(staging, out)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(topmost_created or staging, ignore_errors=True)
        raise
