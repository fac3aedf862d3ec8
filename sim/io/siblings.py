"""Temporary siblings of an output path: their names, and cleaning up after writers that died.

Every output is first written under a sibling name in the same folder (so the final rename is
atomic), ``.STEM.tmp-PID@HOST-RANDOM[.ext]``, and a folder being swapped out may briefly be
``.STEM.old-PID@HOST-RANDOM``. STEM is the output's own name, or for a name too long to take
the ~50 bytes of tag within the 255-byte name limit, its head plus ``~`` and a hash of the
whole name: deterministic (a later run finds the leftovers of an earlier one) and distinct
for names that share a long head.

A leftover counts as stale only when its writer's PID no longer exists on this HOST, so a
concurrent writer's work in progress (or another host's, on a shared disk) is never touched.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
from pathlib import Path

NAME_LIMIT = 255
"""Bytes in one path component on Linux, macOS and Windows filesystems alike (``NAME_MAX``)."""
TAG_BYTES = 56
"""Room kept for a sibling's tag: ``.`` + ``.tmp-`` + PID + ``@`` + host + ``-`` + random + extension."""

# .STEM.tmp-PID@HOST-RANDOM[.ext] or .STEM.old-PID@HOST-RANDOM; .NAME.old-PID as batchsim 0.1.0 named it.
_SIBLING = (
    r"\.{stem}\.(?:(?P<kind>tmp|old)-(?P<pid>\d+)@(?P<host>[0-9a-f]{{8}})-[a-z0-9_]+(?:\.[a-z]+)?"
    r"|old-(?P<legacy>\d+))"
)
_EXTENSION = re.compile(r"\.[a-z]{1,8}")
HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def owner() -> str:
    """``PID@HOST`` of this process (read at each call: a forked worker has its own PID)."""
    return f"{os.getpid()}@{HOST}"


def sibling_stem(name: str) -> str:
    """The part of ``name`` that its temporary siblings carry: all of it when it leaves room for the tag."""
    raw = os.fsencode(name)
    if len(raw) + TAG_BYTES <= NAME_LIMIT:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:10]
    return os.fsdecode(raw[: NAME_LIMIT - TAG_BYTES - len(digest) - 1]) + "~" + digest


def tmp_prefix(target: Path) -> str:
    """Prefix of a temporary sibling of ``target`` (``mkstemp``/``mkdtemp`` add the random part)."""
    return f".{sibling_stem(target.name)}.tmp-{owner()}-"


def tmp_suffix(target: Path) -> str:
    """``target``'s extension when it is a short lower-case one (writers pick the format from it), else ''."""
    return target.suffix if _EXTENSION.fullmatch(target.suffix) else ""


def old_name(target: Path) -> Path:
    """Where the previous ``target`` folder waits while the new one is renamed in (the fallback swap)."""
    return target.with_name(f".{sibling_stem(target.name)}.old-{owner()}-{secrets.token_hex(4)}")


def stale_siblings(target: Path) -> list[tuple[str, Path]]:
    """(tmp|old, path) of siblings written for ``target`` by processes of this host that are gone."""
    pattern = re.compile(_SIBLING.format(stem=re.escape(sibling_stem(target.name))))
    found = []
    for entry in target.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and (match["host"] or HOST) == HOST and not pid_alive(int(match["pid"] or match["legacy"])):
            found.append((match["kind"] or "old", entry))
    return found


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists on this host (this process counts as alive)."""
    if pid == os.getpid() or os.name == "nt":  # Windows os.kill would terminate the process: assume alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: exists, owned by someone else
        return True
    return True


def remove_path(path: Path) -> None:
    """Delete a file, symlink or folder tree if it is there; never follows a symlink."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink(missing_ok=True)


def current_umask() -> int:
    """The process umask."""
    mask = os.umask(0)  # the only way to read it; set straight back
    os.umask(mask)
    return mask
