"""The rollout backend interface: action requests in, the model's normalised action chunks out.

A backend takes the payloads :class:`~rlinf_cosmos3.workers.rollout.adapter.Cosmos3ActionAdapter`
builds and returns, per payload, the model's raw output ``[B, 16, D]`` (normalised, ``D >= 10``
channels, before any de-normalisation). All LIBERO conventions stay in the adapter, so the two
backends share every line of action maths and differ only in where the model runs:

* :class:`~rlinf_cosmos3.workers.rollout.sglang_group.SGLangServerGroup` — ``sglang serve``
  processes (one per GPU) behind HTTP;
* :class:`~rlinf_cosmos3.workers.rollout.embedded.EmbeddedPolicyBackend` — diffusers'
  ``Cosmos3OmniPipeline`` inside Ray actors (:class:`EmbeddedPolicyWorker`).

``generate`` is a coroutine so the pipelined eval runner can keep several requests (of different
stages and servers) in flight at once. Use a backend as a context manager: ``__enter__`` starts
it and ``__exit__`` always stops it, also when the block raises.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rlinf_cosmos3.cluster import Cluster
    from rlinf_cosmos3.workers.rollout.config import EmbeddedConfig, RolloutModelConfig, SGLangConfig

BACKENDS = ("sglang", "embedded")


class RolloutBackendError(RuntimeError):
    """The backend cannot serve any more requests (every server or worker is gone)."""


class RolloutBackend(abc.ABC):
    """Serves batched policy requests; see the module docstring."""

    @property
    @abc.abstractmethod
    def max_batch_size(self) -> int:
        """Largest number of images one payload may carry."""

    @abc.abstractmethod
    def start(self) -> None:
        """Bring the model up; on failure everything already started is stopped before raising."""

    @abc.abstractmethod
    async def generate(self, payloads: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        """Serve ``payloads`` concurrently; per payload the normalised ``[B, 16, D]`` float32 output."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop everything this backend started (idempotent)."""

    def __enter__(self) -> RolloutBackend:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def make_backend(
    kind: str,
    model_cfg: RolloutModelConfig,
    *,
    sglang_cfg: SGLangConfig | None = None,
    embedded_cfg: EmbeddedConfig | None = None,
    log_dir: str | Path,
    cluster: Cluster | None = None,
) -> RolloutBackend:
    """The configured backend, not yet started (``rollout.rollout_backend``: ``sglang`` | ``embedded``)."""
    if kind == "sglang":
        from rlinf_cosmos3.workers.rollout.config import SGLangConfig
        from rlinf_cosmos3.workers.rollout.sglang_group import SGLangServerGroup

        return SGLangServerGroup(model_cfg, sglang_cfg or SGLangConfig(), log_dir=log_dir, cluster=cluster)
    if kind == "embedded":
        from rlinf_cosmos3.workers.rollout.config import EmbeddedConfig
        from rlinf_cosmos3.workers.rollout.embedded import EmbeddedPolicyBackend

        if cluster is None:
            raise ValueError("the embedded backend runs in Ray actors: pass the run's Cluster")
        return EmbeddedPolicyBackend(model_cfg, embedded_cfg or EmbeddedConfig(), cluster=cluster)
    raise ValueError(f"unknown rollout backend {kind!r}; use one of {list(BACKENDS)}")
