"""``rollout.replay``: the settings of the model-free replay backend.

Its own module so that :mod:`rlinf_cosmos3.config.rollout` keeps to the model and the servers. The
dataset, its stats file and its recorded episodes are checked, with the dataset reader, by
:func:`rlinf_cosmos3.validation.rollout.check_replay` before Ray starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_cosmos3.config.base import require


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

    def validate(self, root: str = "rollout.replay") -> ReplayConfig:
        """The values; the dataset and the stats file are read by ``validation.rollout.check_replay``."""
        require(self.batching_max_size >= 1, f"{root}.batching_max_size", f"must be >= 1, got {self.batching_max_size}")
        return self
