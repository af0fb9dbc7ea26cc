"""The rollout backend interface: action requests in, the model's normalised action chunks out.

A backend takes the payloads :class:`~rlinf_cosmos3.workers.rollout.adapter.Cosmos3ActionAdapter`
builds and returns, per payload, the model's raw output ``[B, 16, D]`` (normalised, ``D >= 10``
channels, before any de-normalisation). All LIBERO conventions stay in the adapter, so the two
backends share every line of action maths and differ only in where the model runs:

* :class:`~rlinf_cosmos3.workers.rollout.sglang_group.SGLangServerGroup` — ``sglang serve``
  processes (one per GPU) behind HTTP;
* :class:`~rlinf_cosmos3.workers.rollout.embedded.EmbeddedPolicyBackend` — diffusers'
  ``Cosmos3OmniPipeline`` inside Ray actors (:class:`EmbeddedPolicyWorker`);
* :class:`~rlinf_cosmos3.workers.rollout.replay.ReplayBackend` — no model: a recorded dataset's
  actions, encoded as the model would output them (a conventions self-check).

``generate`` is a coroutine so the pipelined eval runner can keep several requests (of different
stages and servers) in flight at once. Use a backend as a context manager: ``__enter__`` starts
it and ``__exit__`` always stops it, also when the block raises.

This module imports neither backend (they import it); choosing one by name is
:mod:`~rlinf_cosmos3.workers.rollout.factory`'s job.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np


class RolloutBackendError(RuntimeError):
    """The backend cannot serve any more requests (every server or worker is gone)."""


class RolloutBackend(abc.ABC):
    """Serves batched policy requests; see the module docstring."""

    needs_episode_context: bool = False
    """True for a backend that answers from the episode, not the images (``replay``): the adapter then
    adds each row's task, init state and policy step to the payload (``"episode"``; never sent to SGLang)."""
    groups_by_prompt_length: bool = True
    """Whether requests may only batch prompts of one token length (SGLang's rule; needs the tokenizer)."""

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
