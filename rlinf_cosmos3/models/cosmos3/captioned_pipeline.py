"""diffusers' Cosmos3 pipeline with two serving settings it has no argument for: a verbatim caption, a flow shift.

``Cosmos3OmniPipeline.__call__`` (diffusers 0.42.1) builds the action caption itself from the prompt
(``_build_action_json_prompt``), so a caption of another style -- NVIDIA's, with its
``"idle_frame"`` field (:mod:`~rlinf_cosmos3.models.cosmos3.captions`) -- cannot be passed in. This
subclass only overrides that one builder: inside :meth:`CaptionedCosmos3Pipeline.verbatim_caption`
the caption is the given text, outside it is diffusers' own, unchanged. The flow shift is the
scheduler's config field (``UniPCMultistepScheduler.flow_shift``), set by :meth:`use_flow_shift`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from diffusers import Cosmos3OmniPipeline


class CaptionedCosmos3Pipeline(Cosmos3OmniPipeline):
    """``Cosmos3OmniPipeline`` that can be given the action caption verbatim and a flow shift."""

    _verbatim: str | None = None

    def _build_action_json_prompt(self, description: str, **kwargs: Any) -> str:  # type: ignore[override]
        if self._verbatim is not None:
            return self._verbatim
        return Cosmos3OmniPipeline._build_action_json_prompt(description, **kwargs)

    @contextmanager
    def verbatim_caption(self, caption: str) -> Iterator[None]:
        """Calls inside the block are prompted with ``caption`` itself (tokenized with the chat template)."""
        self._verbatim = caption
        try:
            yield
        finally:
            self._verbatim = None

    def use_flow_shift(self, flow_shift: float) -> None:
        """Sample with ``flow_shift`` (the scheduler is rebuilt from its config when it differs)."""
        if float(self.scheduler.config.flow_shift) != float(flow_shift):
            self.scheduler = type(self.scheduler).from_config(self.scheduler.config, flow_shift=float(flow_shift))
