"""``rollout.replay``: the settings of the model-free replay backend, checked before Ray starts.

Its own module so that ``rollout/config.py`` keeps to the model and the servers; importing it stays light
(the dataset's episode table is read with pyarrow only inside :meth:`ReplayConfig.validate`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from rlinf_cosmos3.actions.stats import ActionStatsError, load_action_stats
from rlinf_cosmos3.config.base import ConfigError, require, require_path

logger = logging.getLogger(__name__)


@dataclass
class ReplayConfig:
    """``rollout.replay``: the model-free backend that answers with a recorded dataset's actions
    (:mod:`~rlinf_cosmos3.workers.rollout.replay`): a check of the eval's conventions before GPU hours."""

    dataset_root: str | None = None
    """LeRobot v3 dataset recorded in the same simulator (``meta/episodes`` names each episode's
    ``task_id`` and ``init_state_id``, as ``toolkits/libero/record_demos.py`` writes them)."""
    stats_path: str | None = None
    """Stats file the recorded actions are encoded with, as the SFT data path encodes its targets
    (``data.dataset.stats_path`` of the training); None: ``rollout.model.action_stats_path``. Set it to
    the training's file to check that the eval de-normalises with the right one."""
    batching_max_size: int = 64
    """Observations per request (nothing is computed per image; bigger is just fewer requests)."""

    def validate(self, pairs: list[tuple[int, int]], suite: str, num_settle_steps: int,
                 root: str = "rollout.replay") -> ReplayConfig:
        """The dataset, the stats file and a recorded episode for every (task, init state) of ``pairs``."""
        from rlinf_cosmos3.data.recorded_episodes import (
            ReplayEpisodesError,
            choose_episodes,
            read_recorded_episodes,
        )

        data = require_path(self.dataset_root, f"{root}.dataset_root", "LeRobot dataset", is_dir=True)
        require((data / "meta" / "info.json").is_file(), f"{root}.dataset_root",
                f"'{data}' has no meta/info.json: not a LeRobot v3 dataset",
                "point it at a dataset written by toolkits/libero/record_demos.py")
        if self.stats_path is not None:
            stats = require_path(self.stats_path, f"{root}.stats_path", "action stats file", is_dir=False)
            try:
                load_action_stats(stats)
            except (ActionStatsError, OSError, json.JSONDecodeError) as err:
                raise ConfigError(f"{root}.stats_path", f"unusable stats file: {err}",
                                  "use the stats file the SFT run trained with") from err
        require(self.batching_max_size >= 1, f"{root}.batching_max_size", f"must be >= 1, got {self.batching_max_size}")
        try:
            chosen, missing = choose_episodes(read_recorded_episodes(data), pairs)
        except ReplayEpisodesError as err:
            raise ConfigError(f"{root}.dataset_root", str(err),
                              "record the dataset with toolkits/libero/record_demos.py") from err
        require(not missing, f"{root}.dataset_root",
                f"'{data}' has no recorded episode for (task, init state) {missing[:8]}"
                + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""),
                "restrict env.eval.task_ids / env.eval.init_state_ids to recorded episodes, or record them "
                "(toolkits/libero/record_demos.py)")
        for (task, init), episode in chosen.items():
            require(episode.suite in (None, suite), "env.eval.suite",
                    f"'{suite}' but episode {episode.episode_index} (task {task}, init state {init}) was "
                    f"recorded in '{episode.suite}'", f"set env.eval.suite={episode.suite}")
            require(episode.num_settle_steps in (None, num_settle_steps), "env.eval.num_settle_steps",
                    f"{num_settle_steps} but episode {episode.episode_index} was recorded after "
                    f"{episode.num_settle_steps} settle steps (its frame 0 is another scene)",
                    f"set env.eval.num_settle_steps={episode.num_settle_steps}")
        failed = sorted(pair for pair, e in chosen.items() if e.success is False)
        if failed:
            logger.warning("%s: only failed recordings of (task, init state) %s: their replays cannot succeed",
                           data, failed[:8])
        return self
