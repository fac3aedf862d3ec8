"""The one way batchsim writes a file the user names or sees: checked, atomic, never over a non-file.

Every file the CLI writes goes through :func:`atomic_file` (or :func:`write_text`), except
those written inside a private temporary folder that :func:`sim.io.outputs.atomic_folder`
then swaps in as a whole (it applies the same checks and error mapping to the folder):

1. The path is checked completely first (:func:`sim.io.safe_paths.check_target`): it must be
   new or a regular file; a folder, FIFO, socket or device (``/dev/null``, ``/dev/full``,
   also behind a symlink), a symlink loop, an over-long name or path, a parent that is a file
   or an unwritable folder is a :class:`~sim.errors.UserError` before anything is written.
2. Missing parent folders are created, and removed again if the write fails.
3. The data goes to a temporary sibling (same folder, so the rename is atomic), which then
   replaces the target with ``os.replace``: a reader sees the old file or the new one, whole.
   A replaced file keeps its permission bits; a new one gets ``0o666 & ~umask``.
4. An ``OSError`` while writing (a full disk, a quota, a read-only filesystem, ...) becomes
   one UserError naming the path, after the temporary file and created folders are removed.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import UserError
from sim.io.safe_paths import check_target, shown
from sim.io.siblings import current_umask, remove_path, stale_siblings, tmp_prefix, tmp_suffix

_ADVICE = {
    errno.ENOSPC: "the disk is full; free some space or write elsewhere",
    errno.EDQUOT: "the disk quota is used up; free some space or write elsewhere",
    errno.EROFS: "the filesystem is read-only; write elsewhere",
    errno.EACCES: "permission denied; write elsewhere or fix the permissions",
    errno.EPERM: "not permitted; write elsewhere or fix the permissions",
    errno.ENAMETOOLONG: "the name is too long; give a shorter one",
    errno.EFBIG: "the file is larger than this filesystem allows; write elsewhere",
}


def write_error(exc: OSError, path: str | Path, field: str = "out") -> UserError:
    """The UserError for an ``OSError`` met while writing ``path``: what failed and what to do."""
    reason = exc.strerror or str(exc)
    advice = _ADVICE.get(exc.errno or 0)
    return UserError(f"cannot write {shown(path)}: {reason}" + (f" ({advice})" if advice else ""), field=field)


@contextmanager
def atomic_file(path: str | Path, *, field: str = "out") -> Iterator[Path]:
    """Yield a temporary sibling path that replaces ``path`` if the block succeeds.

    Args:
        path: the file to write: new, or an existing regular file (a symlink to one is followed).
        field: the option or setting named in errors.

    Raises:
        UserError: ``path`` is not writable as a regular file (see the module docstring), or an
            ``OSError`` in the block or while replacing; nothing is left behind then.
    """
    target = check_target(path, field=field)
    made: list[Path] = []
    tmp: Path | None = None
    try:
        made = make_folders(target.missing)
        for _, leftover in stale_siblings(target.path):  # dead writers' temporary files
            remove_path(leftover)
        handle, name = tempfile.mkstemp(prefix=tmp_prefix(target.path), suffix=tmp_suffix(target.path),
                                        dir=target.path.parent)  # fmt: skip
        os.close(handle)
        tmp = Path(name)
        yield tmp
        replace_file(tmp, target.path, field=field)
        tmp = None
    except BaseException as exc:
        if tmp is not None:
            remove_path(tmp)
        remove_folders(made)
        if isinstance(exc, OSError):
            raise write_error(exc, path, field) from None
        raise


def replace_file(tmp: Path, target: Path, *, field: str = "out") -> None:
    """Move the written ``tmp`` onto ``target``, refusing a target that became a non-file meanwhile."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # replaced by a FIFO or device while writing
        check_target(target, field=field)  # raises, naming what it now is
    os.chmod(tmp, stat.S_IMODE(mode) if mode is not None else 0o666 & ~current_umask())
    os.replace(tmp, target)


def write_text(path: str | Path, text: str, *, field: str = "out", fsync: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_file`; ``fsync`` flushes it to disk first."""
    with atomic_file(path, field=field) as tmp, open(tmp, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    return Path(path)


def make_folders(folders: tuple[Path, ...] | list[Path]) -> list[Path]:
    """Create ``folders`` (outermost first); returns those this call created, for :func:`remove_folders`."""
    made = []
    try:
        for folder in folders:
            try:
                os.mkdir(folder)
            except FileExistsError:  # made meanwhile by someone else: not ours to remove
                continue
            made.append(folder)
    except BaseException:
        remove_folders(made)
        raise
    return made


def remove_folders(made: list[Path]) -> None:
    """Remove folders :func:`make_folders` created, innermost first, where they are still empty."""
    for folder in reversed(made):
        try:
            os.rmdir(folder)
        except OSError:  # not empty: something else put files there
            return
