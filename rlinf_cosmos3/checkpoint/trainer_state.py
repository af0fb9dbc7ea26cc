"""The small, JSON-serialised part of the resume state: where training and the data stream are."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainerState:
    """Training progress saved with every checkpoint.

    ``global_step`` counts completed optimizer steps (the checkpoint directory is
    ``global_step_<global_step>``). ``epoch`` and ``sample_offset`` locate the data stream: the
    number of samples of ``epoch`` already consumed, summed over all data-parallel ranks.
    ``consumed_samples`` is the total since the start of training. ``sampler_state`` and
    ``extra`` hold any further JSON-serialisable state of the sampler and the runner.
    """

    global_step: int
    epoch: int = 0
    sample_offset: int = 0
    consumed_samples: int = 0
    sampler_state: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.global_step < 0:
            raise ValueError(f"global_step must be >= 0, got {self.global_step}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        return cls(**json.loads(text))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> TrainerState:
        return cls.from_json(Path(path).read_text())
