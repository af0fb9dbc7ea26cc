"""Which recorded episode of a LeRobot dataset the ``replay`` backend plays for an eval (task, init state).

Read from ``meta/episodes`` only (pyarrow, imported when called: no video, no lerobot), so the eval
config check (:mod:`rlinf_cosmos3.validation`) can check every requested pair before Ray or a simulator
starts; it sits with the dataset readers, below both that check and the backend. The repo's recorder
(``toolkits/libero/record_demos.py``) stores ``suite``, ``task_id``, ``init_state_id``, ``success`` and
``num_settle_steps`` per episode. Of several recordings of one pair the first successful one is
played (a failed demonstration cannot show that success is reproduced), else the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REQUIRED_COLUMNS = ("episode_index", "task_id", "init_state_id")
OPTIONAL_COLUMNS = ("suite", "success", "num_settle_steps")


class ReplayEpisodesError(ValueError):
    """The dataset cannot say which episode belongs to an eval episode."""


@dataclass(frozen=True)
class RecordedEpisode:
    """One row of ``meta/episodes``: what the replay needs to know about a recorded episode."""

    episode_index: int
    task_id: int
    init_state_id: int
    suite: str | None = None
    success: bool | None = None
    num_settle_steps: int | None = None


def read_recorded_episodes(root: str | Path) -> list[RecordedEpisode]:
    """Every episode of the LeRobot v3 dataset at ``root``, by ``episode_index``."""
    import pyarrow.parquet as pq

    files = sorted((Path(root) / "meta" / "episodes").rglob("*.parquet"))
    if not files:
        raise ReplayEpisodesError(f"'{root}' has no meta/episodes/*.parquet: not a LeRobot v3 dataset")
    rows = []
    for path in files:
        schema = pq.read_schema(path)
        missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
        if missing:
            raise ReplayEpisodesError(f"'{path}' has no {missing} column: the dataset does not say which task "
                                      "and init state each episode was recorded from")
        columns = [*REQUIRED_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in schema.names)]
        rows += pq.read_table(path, columns=columns).to_pylist()
    return sorted((RecordedEpisode(**row) for row in rows), key=lambda e: e.episode_index)


def choose_episodes(episodes: list[RecordedEpisode], pairs: list[tuple[int, int]]
                    ) -> tuple[dict[tuple[int, int], RecordedEpisode], list[tuple[int, int]]]:
    """Per (task, init state) of ``pairs`` the episode to play (see the module docstring), and the
    pairs that have none."""
    by_pair: dict[tuple[int, int], list[RecordedEpisode]] = {}
    for episode in episodes:
        by_pair.setdefault((episode.task_id, episode.init_state_id), []).append(episode)
    chosen, missing = {}, []
    for pair in pairs:
        found = by_pair.get(pair)
        if not found:
            missing.append(pair)
            continue
        chosen[pair] = next((e for e in found if e.success), found[0])
    return chosen, missing
