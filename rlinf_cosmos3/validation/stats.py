"""A stats file against the config section that names it, checked the same way for training and evaluation.

The file must be valid, made with the section's fps, chunk length and normalisation where its metadata
says how it was made, and its gripper range (and recorded convention, when there is one) must fit the
section's gripper convention: a ±1 dataset trained or served as ``zero_one`` (or the reverse) runs fine
and sends every gripper command inverted or halved, so it is stopped here, from the stats file alone.
``data.dataset`` (:mod:`rlinf_cosmos3.validation.sft`) and ``rollout.model``
(:mod:`rlinf_cosmos3.validation.rollout`) each describe their fields and words with a :class:`StatsFields`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf_cosmos3.actions.conversion import GRIPPER_INDEX_10
from rlinf_cosmos3.actions.gripper import gripper_range_problem
from rlinf_cosmos3.actions.stats import ActionStatsError, load_action_stats
from rlinf_cosmos3.config.base import ConfigError, require
from rlinf_cosmos3.config.model_settings import ModelSettings

STATS_METADATA = {"fps": "fps", "chunk_length": "action_horizon", "normalization": "normalization"}
"""Stats metadata key (``actions/stats.py`` records them) -> the model setting it must equal."""


@dataclass(frozen=True)
class StatsFields:
    """How one config section reports a stats file that does not fit it."""

    stats: str
    """The field naming the stats file (``data.dataset.stats_path``)."""
    convention: str
    """The field of the gripper convention (``data.dataset.gripper_convention``)."""
    fix: str
    """What to do about a stats file that is unusable or made with other settings."""
    other_metadata: str
    """The problem when a metadata value differs; ``str.format`` fields ``path``, ``key``, ``recorded``, ``expected``."""
    other_convention: str
    """The problem when the stats record another convention; fields ``path``, ``convention``, ``recorded``."""


def load_stats(path: Path, field: str, fix: str) -> dict[str, Any]:
    """The validated stats file at ``path``; an unreadable or malformed one is a :class:`ConfigError` on ``field``."""
    try:
        return load_action_stats(path)
    except (ActionStatsError, OSError) as err:
        raise ConfigError(field, f"unusable stats file: {err}", fix) from err


def check_stats_file(path: Path, fields: StatsFields, settings: ModelSettings) -> None:
    """``path`` must be a valid stats file whose metadata agrees with ``settings`` (:data:`STATS_METADATA`;
    a key the file does not record is not checked) and whose gripper fits ``settings.gripper_convention``."""
    stats = load_stats(path, fields.stats, fields.fix)
    meta = stats.get("metadata", {})
    for key, name in STATS_METADATA.items():
        expected = getattr(settings, name)
        if key in meta:
            require(meta[key] == expected, fields.stats,
                    fields.other_metadata.format(path=path, key=key, recorded=meta[key], expected=expected), fields.fix)
    convention, recorded = settings.gripper_convention, meta.get("gripper_convention")
    require(recorded in (None, convention), fields.convention,
            fields.other_convention.format(path=path, convention=convention, recorded=recorded),
            f"set {fields.convention}={recorded}, or use stats of the data trained on")
    raw = stats["global_raw"]
    problem = gripper_range_problem(raw["min"][GRIPPER_INDEX_10], raw["max"][GRIPPER_INDEX_10], convention)
    require(problem is None, fields.convention, f"'{convention}' but in the stats '{path}' {problem}",
            f"set {fields.convention} to the convention the training data stores (zero_one, pm_one or pm_one_flip)")
