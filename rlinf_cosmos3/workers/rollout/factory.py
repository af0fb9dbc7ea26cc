"""Choosing a rollout backend by name (``rollout.rollout_backend``): :data:`BACKENDS`, :func:`make_backend`.

Kept apart from the interface (:mod:`~rlinf_cosmos3.workers.rollout.backend`) because both backends
import the interface: the factory sits above them, so no module of the package imports one that
imports it back. The backends are imported inside :func:`make_backend`, so importing the factory pulls
in neither Ray, torch nor httpx. The names (``BACKENDS``) are declared with ``rollout.rollout_backend``
in :mod:`rlinf_cosmos3.config.eval`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlinf_cosmos3.config.eval import BACKENDS

if TYPE_CHECKING:
    from rlinf_cosmos3.cluster import Cluster
    from rlinf_cosmos3.config.replay import ReplayConfig
    from rlinf_cosmos3.config.rollout import (
        EmbeddedConfig,
        RolloutModelConfig,
        SGLangConfig,
    )
    from rlinf_cosmos3.workers.rollout.backend import RolloutBackend


def make_backend(
    kind: str,
    model_cfg: RolloutModelConfig,
    *,
    sglang_cfg: SGLangConfig | None = None,
    embedded_cfg: EmbeddedConfig | None = None,
    replay_cfg: ReplayConfig | None = None,
    log_dir: str | Path,
    cluster: Cluster | None = None,
) -> RolloutBackend:
    """The configured backend, not yet started (``rollout.rollout_backend``: ``sglang`` | ``embedded`` | ``replay``)."""
    if kind == "sglang":
        from rlinf_cosmos3.config.rollout import SGLangConfig
        from rlinf_cosmos3.workers.rollout.sglang_group import SGLangServerGroup

        return SGLangServerGroup(model_cfg, sglang_cfg or SGLangConfig(), log_dir=log_dir, cluster=cluster)
    if kind == "embedded":
        from rlinf_cosmos3.config.rollout import EmbeddedConfig
        from rlinf_cosmos3.workers.rollout.embedded import EmbeddedPolicyBackend

        if cluster is None:
            raise ValueError("the embedded backend runs in Ray actors: pass the run's Cluster")
        return EmbeddedPolicyBackend(model_cfg, embedded_cfg or EmbeddedConfig(), cluster=cluster)
    if kind == "replay":
        from rlinf_cosmos3.workers.rollout.replay import ReplayBackend

        if replay_cfg is None:
            raise ValueError("the replay backend needs rollout.replay (its dataset_root)")
        return ReplayBackend(model_cfg, replay_cfg)
    raise ValueError(f"unknown rollout backend {kind!r}; use one of {list(BACKENDS)}")
