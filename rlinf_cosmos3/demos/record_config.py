"""What a recording records and where: its own module so that the input checks and the recorder share it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlinf_cosmos3.config.libero_suites import NUM_SETTLE_STEPS, suite_max_steps
from rlinf_cosmos3.demos.lerobot_writer import FPS, IMAGE_SIZE
from rlinf_cosmos3.demos.scripted_policy import ScriptedPolicyConfig

RECORDED_ACTIONS = ("executed", "clean")
"""What a frame's action is: the command sent to the simulator (``policy.noise_std`` included), or the
scripted policy's command before that noise (DART-style: the states show the perturbations, the labels
the correction back to the scripted path). The same without noise."""


@dataclass
class RecordConfig:
    """What to record and where (see toolkits/libero/record_demos.py for the CLI)."""

    suite: str
    task_ids: Sequence[int]
    init_state_ids: Sequence[int]
    out: Path
    repo_id: str = "local/libero_demos"
    max_steps: int | None = None  # recorded steps; None = the suite's cap minus the settle steps
    num_settle_steps: int = NUM_SETTLE_STEPS
    seed: int = 0
    keep_failed: bool = False
    num_envs: int = 1
    image_size: int = IMAGE_SIZE
    fps: int = FPS
    camera_storage: str = "video"  # "video" (MP4) or "image" (PNG frames in the parquet files)
    policy: ScriptedPolicyConfig = field(default_factory=ScriptedPolicyConfig)
    recorded_action: str = "executed"  # one of RECORDED_ACTIONS
    writer_procs: int = 1
    """Processes that write finished episodes (PNG frames, video encode, statistics) while the simulators
    go on; does not change what is recorded. The command line's default is :func:`default_writer_procs`."""
    concatenate_videos: bool = False
    """How the join lays out the videos (the frames are the same either way). False: one MP4 per episode and
    camera, copied as written, so the join costs O(episodes). True: lerobot's packing into large files, which
    remuxes the growing file once per episode (O(episodes^2): ~48 s for 97 episodes on a 16-core host)."""
    repeats: int = 1
    """Episodes per (task, init state), each with its own policy seed: distinct demonstrations of one
    start only when the policy draws something (``policy.place_jitter``, ``policy.approach_jitter`` or
    ``policy.noise_std``)."""

    def resolved_max_steps(self) -> int:
        if self.num_settle_steps < 0:
            raise ValueError(f"num_settle_steps must be >= 0, got {self.num_settle_steps}")
        if self.max_steps is not None:
            if self.max_steps < 1:
                raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
            return self.max_steps
        return suite_max_steps(self.suite) - self.num_settle_steps


def default_writer_procs(cpu_count: int | None = None) -> int:
    """Writer processes for a host of ``cpu_count`` cores (default: this one's): one per 2 cores. On a 16-core
    host recording 40 demonstrations with 16 simulators, 4 writers left the recorder waiting 20-24 s to hand
    episodes over (69-71 s in all); 8 took that wait to 3-5 s (52 and 68 s, the host's drift between them),
    12 to 0.1 s with no faster wall (docs/benchmarks.md, the writers sweep of 2026-12-07)."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, cores // 2)
