"""Id lists as researchers type them on a command line: ``0 3 7``, ``0,3,7``, ranges ``10-19``, mixed."""

from __future__ import annotations

from collections.abc import Iterable


def parse_id_list(tokens: Iterable[str], what: str = "ids") -> list[int]:
    """``['0-3', '7', '9,10']`` -> ``[0, 1, 2, 3, 7, 9, 10]`` (order kept, duplicates dropped).

    Raises ``ValueError`` naming ``what`` for an empty range or a negative id.
    """
    ids: list[int] = []
    for token in tokens:
        for part in token.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise ValueError(f"{what}: empty range {part!r}")
                ids.extend(range(int(lo), int(hi) + 1))
            else:
                ids.append(int(part))
    if any(i < 0 for i in ids):
        raise ValueError(f"{what}: ids must be >= 0, got {ids}")
    return list(dict.fromkeys(ids))
