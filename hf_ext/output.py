"""Atomic output folders: work happens in a hidden staging folder beside OUT that is renamed into place only on
success, never over a folder this run was not asked to replace, with the permissions the umask gives new files.

A staging folder is named `.OUT.partial-<host>-<pid>-<random>`. One that a process of this host left and that no
longer runs (killed with SIGKILL) is removed by any later run that writes an output into the same folder, whatever
that output's name. The host is part of the name because a shared file system is seen by processes of other
machines, whose process ids mean nothing here.
"""

import contextlib
import ctypes
import errno
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from transformers.utils import logging

from .errors import HfExtError

logger = logging.get_logger(__name__)

STAGING_KINDS = ("partial", "old")  # work in progress, and a replaced folder on its way out
# `.<OUT>.<kind>-<host>-<pid>-<random>`: mkdtemp's random part has no "-", so the host (which may) is everything
# between the kind and the last two
STAGING_NAME = re.compile(rf"\.(?P<name>.+)\.(?P<kind>{'|'.join(STAGING_KINDS)})-(?P<host>.+)-(?P<pid>\d+)-[^-]+")
RENAME_NOREPLACE = 1  # linux/fs.h


def check_output_dir(out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse an existing OUT (unless `overwrite`) or one whose parent cannot be written, before any work starts."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise HfExtError(f"output {out} is a dangling symbolic link (to {os.readlink(out)}); remove it or choose "
                         "another output")
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


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_staging(folder: Path) -> None:
    """Remove the staging folders in `folder`, whatever output they were for, that a process of this host left and
    that no longer runs (SIGKILL cannot be caught, so a later run cleans up after it). A folder an overwrite moved
    aside goes back in place first when nothing has taken its place. Staging folders of live processes, and of
    other hosts (whose process ids cannot be checked from here), stay."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        match = STAGING_NAME.fullmatch(entry.name)
        if not match or match["host"] != socket.gethostname() or _process_alive(int(match["pid"])):
            continue
        out, pid = folder / match["name"], match["pid"]
        replaced = entry / out.name
        if match["kind"] == "old" and replaced.is_dir() and not os.path.lexists(out):
            # killed between moving the old output aside and putting the new one in place: the old one goes back
            logger.warning(f"restoring {out} from {replaced}, left by process {pid}")
            with contextlib.suppress(OSError):
                _rename_noreplace(replaced, out)
        logger.warning(f"removing {entry}, left by process {pid}, which no longer runs")
        shutil.rmtree(entry, ignore_errors=True)


def _staging_dir(out: Path, kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.{kind}-{socket.gethostname()}-{os.getpid()}-",
                                 dir=out.absolute().parent))


# per staging folder, the files copied into it and the mode of their source, which `apply_umask` does not exceed
_copied_modes: dict[str, dict[str, int]] = {}


def copy_file(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy the content of `source` to `target` with `source`'s mode, which the commit of a staging folder (see
    `apply_umask`) never widens: a copy of a private file stays private."""
    shutil.copyfile(source, target)
    mode = stat.S_IMODE(os.stat(source).st_mode)
    os.chmod(target, mode)
    target = os.path.abspath(target)
    for staging, modes in _copied_modes.items():
        if target.startswith(staging + os.sep):
            modes[target] = mode


def current_umask() -> int:
    """The process umask (read without changing it where /proc tells it)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(folder: Path) -> None:
    """Give `folder` and everything in it the modes new files get under the umask: mkdtemp makes the staging
    folder 700, and some writers create files 600, which would keep a shared model folder private. A file copied
    with `copy_file` keeps at most its source's mode."""
    mask = current_umask()
    copied = _copied_modes.get(os.path.abspath(folder), {})
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                executable = os.stat(path).st_mode & stat.S_IXUSR
                os.chmod(path, (0o777 if executable else 0o666) & ~mask & copied.get(os.path.abspath(path), 0o777))


def _rename_noreplace(source: Path, target: Path) -> None:
    """Rename `source` to `target`, failing with FileExistsError when `target` exists, atomically.

    `os.rename` would silently replace an empty folder (and, between a check and the rename, a folder another run
    just committed). Linux's renameat2(RENAME_NOREPLACE) makes the check and the rename one step; where it is not
    available (another OS, or a file system without it) the fallback checks first, and the rename then still refuses
    a non-empty target (POSIX), so at worst an empty folder created in that instant is replaced."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd = -100
        if renameat2(at_fdcwd, os.fsencode(source), at_fdcwd, os.fsencode(target), RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), str(target))
        if code not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(code, os.strerror(code), str(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    try:
        os.rename(source, target)
    except OSError as error:
        if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        raise


def commit(staging: Path, out: Path, overwrite: bool) -> None:
    """Put the finished `staging` folder at `out`: never over an existing `out` unless `overwrite`, in which case the
    old folder is moved aside first and removed after the new one is in place."""
    try:
        _rename_noreplace(staging, out)
        return
    except FileExistsError:
        if not overwrite:
            raise HfExtError(f"output {out} was created by someone else while this run worked; nothing was replaced "
                             "(pass --overwrite to replace it)") from None
    backup = _staging_dir(out, "old")
    os.replace(out, backup / out.name)
    try:
        _rename_noreplace(staging, out)
    except FileExistsError:
        raise HfExtError(f"output {out} was created again by someone else while this run replaced it; the folder "
                         f"it replaced is kept in {backup}") from None
    except BaseException:  # a signal between the two renames: the replaced folder goes back
        with contextlib.suppress(OSError):
            _rename_noreplace(backup / out.name, out)
            backup.rmdir()
        raise
    shutil.rmtree(backup, ignore_errors=True)


@contextlib.contextmanager
def atomic_output_dir(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a staging folder beside `out`; on success it becomes `out` (see `commit`), on any failure or signal
    it is removed (with the parent folders this call created)."""
    out = check_output_dir(out, overwrite)
    parent = out.absolute().parent
    # the highest missing ancestor: on failure it goes, with everything this call made below it
    topmost_created = next((p for p in reversed([parent, *parent.parents]) if not p.exists()), None)
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(parent)
    staging = _staging_dir(out, "partial")
    _copied_modes[os.path.abspath(staging)] = {}
    try:
        yield staging
        apply_umask(staging)
        commit(staging, out, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        # the parent folders this call made go only while empty: another run may have committed into them meanwhile
        for folder in [parent, *parent.parents] if topmost_created is not None else []:
            with contextlib.suppress(OSError):
                folder.rmdir()
            if folder == topmost_created:
                break
        raise
    finally:
        del _copied_modes[os.path.abspath(staging)]
