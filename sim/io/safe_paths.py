"""Checking a path before batchsim reads or writes it, so a bad one is one clear error, early.

:func:`check_target` checks an output path completely, without writing anything: each name
against the filesystem's limit (``os.pathconf`` ``PC_NAME_MAX``, 255 where unknown), the whole
path against ``PC_PATH_MAX``, symlink loops, dangling symlinks, parents that are files, and
that the nearest existing folder is writable and not on a read-only filesystem. A file target
must be new or a regular file (never a folder, FIFO, socket or device: ``/dev/null`` and
``/dev/full`` are refused, also through a symlink); a folder target must be new or a folder.

:func:`require_input_file` is the reading side: a missing path, a folder, a device or a FIFO
is named for what it is, and nothing is opened, so a device or a pipe is never read.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sim.errors import UserError
from sim.io.siblings import NAME_LIMIT, TAG_BYTES

PATH_LIMIT = 4096
"""Bytes in a whole path (Linux ``PATH_MAX``), where ``os.pathconf`` cannot say."""
FILE_IN_FOLDER_BYTES = 40
"""Room kept in a folder's path for the names of the files batchsim writes into it (``/iterations.parquet``)."""
SHOWN_CHARS = 80


@dataclass(frozen=True)
class Target:
    """An output path that passed :func:`check_target`.

    Attributes:
        path: where the data goes: absolute, a symlink in the last component followed.
        exists: whether ``path`` exists now (a regular file, or a folder for folder targets).
        missing: parent folders to create first, outermost first.
    """

    path: Path
    exists: bool
    missing: tuple[Path, ...]


def shown(path: str | Path) -> str:
    """``path`` quoted with ``repr`` and cut to about 80 characters, for error messages.

    The middle is cut, not the end: a path's last names are the ones that tell it apart.
    """
    text = repr(str(path))
    if len(text) <= SHOWN_CHARS:
        return text
    tail = SHOWN_CHARS * 2 // 3
    return text[: SHOWN_CHARS - tail - 3] + "..." + text[-tail:]


def kind_of(mode: int) -> str:
    """What a ``st_mode`` is, in words: 'regular file', 'folder', 'FIFO (named pipe)', ..."""
    for test, name in (
        (stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"),
    ):  # fmt: skip
        if test(mode):
            return name
    return "special file"


def check_target(path: str | Path, *, field: str = "out", folder: bool = False) -> Target:
    """Raise UserError unless ``path`` can be written as a file (or, with ``folder``, a folder).

    Writes nothing. Symlinks on the way are followed; a loop or a dangling one is refused.

    Args:
        path: the output path as the user gave it.
        field: the option or setting named in the error.
        folder: check for a folder instead of a regular file.

    Returns:
        The target to write (see :class:`Target`).
    """
    if str(path) == "":
        raise UserError("the path is empty; give a file or folder name", field=field)
    absolute = Path.cwd() / path  # not resolved: '..' after a symlink means what the kernel says
    here = Path(absolute.anchor)
    parts = absolute.parts[1:]
    for index, part in enumerate(parts):
        _check_name(part, here, path, field)
        mode = _mode(here / part, path, field)
        if mode is None:
            for later in parts[index + 1 :]:
                _check_name(later, here, path, field)
            _check_room(absolute, here, path, field, folder)
            missing = tuple(here.joinpath(*parts[index : end + 1]) for end in range(index, len(parts) - 1))
            return Target(absolute, False, missing)
        if index < len(parts) - 1 and not stat.S_ISDIR(mode):
            raise UserError(f"{shown(path)}: {shown(here / part)} is a {_a_file(mode)}, not a folder", field=field)
        here = here / part
    return _existing(absolute, path, field, folder)


def _existing(absolute: Path, path: str | Path, field: str, folder: bool) -> Target:
    real = Path(os.path.realpath(absolute))  # the last component may be a symlink: write where it points
    mode = os.stat(real).st_mode
    if folder and not stat.S_ISDIR(mode):
        raise UserError(f"{shown(path)}: is a {_a_file(mode)}, not a folder; give a folder", field=field)
    if not folder and not stat.S_ISREG(mode):
        what = kind_of(mode) + (f" ({real})" if real != absolute else "")
        raise UserError(f"{shown(path)}: is a {what}, not a regular file; batchsim writes only new or regular "
                        "files, so give a file path", field=field)  # fmt: skip
    _check_room(real, real.parent, path, field, folder)
    return Target(real if not folder else absolute, True, ())


def _a_file(mode: int) -> str:
    return "file" if stat.S_ISREG(mode) else kind_of(mode)


def _mode(path: Path, shown_as: str | Path, field: str) -> int | None:
    """``st_mode`` of ``path`` (symlinks followed), None when it does not exist."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise UserError(
                f"{shown(shown_as)}: {shown(path)} is a symlink to {shown(os.readlink(path))}, which "
                "does not exist; not a folder or file batchsim can write",
                field=field,
            ) from None
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{shown(shown_as)}: {shown(path)} is a symlink loop; give a path without one",
                            field=field) from None  # fmt: skip
        raise UserError(f"{shown(shown_as)}: cannot look up {shown(path)} ({exc.strerror})", field=field) from None


def _check_name(part: str, folder: Path, path: str | Path, field: str) -> None:
    size, limit = len(os.fsencode(part)), _pathconf(folder, "PC_NAME_MAX", NAME_LIMIT)
    if size > limit:
        raise UserError(f"{shown(path)}: the name {shown(part)} is {size} bytes, over the {limit}-byte limit of "
                        "a file name here; give a shorter name", field=field)  # fmt: skip


def _check_room(target: Path, existing: Path, path: str | Path, field: str, folder: bool) -> None:
    """The whole path fits (with a temporary sibling's tag, and for a folder the files in it), and
    ``existing`` can be written in."""
    size, limit = len(os.fsencode(str(target))), _pathconf(existing, "PC_PATH_MAX", PATH_LIMIT)
    room = limit - TAG_BYTES - (FILE_IN_FOLDER_BYTES if folder else 0)
    if size >= room:
        raise UserError(f"{shown(path)}: the path is {size} bytes, over the {room}-byte limit "
                        "batchsim can write here; give a shorter path", field=field)  # fmt: skip
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{shown(path)}: cannot write in {shown(existing)} (permission denied)", field=field)
    if _read_only(existing):
        raise UserError(f"{shown(path)}: {shown(existing)} is on a read-only filesystem", field=field)


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows): the write itself will say
        return False


def _pathconf(folder: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):  # unknown name, Windows
        return default
    return value if value and value > 0 else default


def _input_mode(path: Path, what: str, missing_hint: str, field: str | None) -> int:
    """``os.stat(path).st_mode`` (symlinks followed), or a UserError saying why the path cannot be read."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"{what} not found: {shown(path)}{missing_hint}", field=field) from None
    except OSError as exc:
        reason = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror
        raise UserError(f"{what} {shown(path)}: cannot be read ({reason})", field=field) from None


def require_input_file(path: str | Path, what: str, *, field: str | None = None) -> Path:
    """Return ``path`` if it is a regular file (symlinks followed); UserError saying what it is otherwise.

    Opens nothing: a FIFO or a device is refused before anything could block on it or read it.
    """
    path = Path(path)
    mode = _input_mode(path, what, "", field)
    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {shown(path)}: is a folder, not a file; give the file's path", field=field)
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {shown(path)}: is a {kind_of(mode)}, not a regular file; give a file",
                        field=field)  # fmt: skip
    return path


def require_input_folder(path: str | Path, what: str, *, field: str | None = None) -> Path:
    """Return ``path`` if it is a folder (symlinks followed); UserError saying what it is otherwise."""
    path = Path(path)
    mode = _input_mode(path, what, "; give an existing folder", field)
    if not stat.S_ISDIR(mode):
        raise UserError(f"{what} {shown(path)}: is a {_a_file(mode)}, not a folder; give a folder", field=field)
    return path
