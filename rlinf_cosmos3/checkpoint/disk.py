"""Free-space probing of the filesystem a checkpoint directory lives on.

One probe, :func:`free_bytes`, serves the start-up check, the check before each save and the
diagnosis of a failed write; callers look it up through this module (``disk.free_bytes``) so a
test can make the disk look full in one place.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from rlinf_cosmos3.checkpoint.errors import InsufficientSpaceError

# errno values that mean "the filesystem (or the user's quota on it) is full".
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# Their messages, as they read once an OSError was flattened to text (e.g. gathered from a rank).
_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "[errno 28]", "[errno 122]")
# How torch's zip writer reports a short write, with no errno: "[enforce fail at
# inline_container.cc:672] . unexpected pos 2824907328 vs 2824907216", "PytorchStreamWriter failed
# writing file data/0: file write failed". Other I/O faults read the same, so these need a probe.
_SHORT_WRITE_TEXTS = ("unexpected pos", "file write failed")
_FULL_PATTERNS = _FULL_TEXTS + _SHORT_WRITE_TEXTS


def existing_ancestor(path: str | Path) -> Path:
    """``path`` or its nearest existing parent (a checkpoint directory may not exist yet)."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer can still allocate on the filesystem holding ``path``."""
    return int(shutil.disk_usage(existing_ancestor(path)).free)


def used_bytes(path: str | Path) -> int:
    """Bytes allocated on disk by the files under ``path`` (``du``); 0 if it does not exist."""
    path = Path(path)
    if not path.exists():
        return 0
    total = 0
    for item in (path, *path.rglob("*")):
        try:
            total += item.lstat().st_blocks * 512
        except FileNotFoundError:  # removed while walking
            continue
    return total


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, its causes/contexts, and the per-rank exceptions torch.distributed.checkpoint wraps."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) else failure
                if isinstance(inner, BaseException):
                    todo.append(inner)


def _matches(err: BaseException) -> bool:
    text = str(err).lower()
    return any(pattern in text for pattern in _FULL_PATTERNS)


def is_proven_full(err: BaseException) -> bool:
    """True if ``err`` (or anything it wraps) is an ENOSPC/EDQUOT ``OSError``, or carries its message."""
    return any(
        (isinstance(e, OSError) and e.errno in _FULL_ERRNOS) or any(t in str(e).lower() for t in _FULL_TEXTS)
        for e in _chain(err)
    )


def full_disk_cause(err: BaseException) -> str | None:
    """If ``err`` is, or could be, a write that hit a full disk: the culprit as one line, else None.

    An ``OSError`` with ENOSPC/EDQUOT wins; otherwise the innermost exception whose message reads
    like a short write (torch's zip writer reports none with an errno).
    """
    chain = list(_chain(err))
    culprit = next((e for e in chain if isinstance(e, OSError) and e.errno in _FULL_ERRNOS), None)
    if culprit is None:
        culprit = next((e for e in reversed(chain) if _matches(e)), None)
    if culprit is None:
        return None
    lines = [line.strip() for line in str(culprit).splitlines() if line.strip()] or [""]
    line = next((x for x in lines if any(p in x.lower() for p in _FULL_PATTERNS)), lines[0])
    return f"{type(culprit).__name__}: {line[:300]}"


def require_free_space(path: str | Path, needed: int, *, what: str, fix: str) -> int:
    """Raise :class:`InsufficientSpaceError` unless ``path``'s filesystem has ``needed`` bytes free.

    Returns the free bytes. The message names the directory, both numbers and ``fix``.
    """
    free = free_bytes(path)
    if free < needed:
        raise InsufficientSpaceError(
            f"not enough disk space in {Path(path)} for {what}: {format_bytes(needed)} ({needed:,} bytes) "
            f"needed, {format_bytes(free)} ({free:,} bytes) free on its filesystem "
            f"({existing_ancestor(path)}). Fix: {fix}"
        )
    return free
