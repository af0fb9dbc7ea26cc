"""``benchmarks/sim_step_cost.py`` on the real LIBERO simulator: the chunk rounds it times, and with
``--with-frames`` the same rounds returning every step's frames (what an eval saving videos asks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.libero]


def test_rendering_every_step_for_videos_is_measured_beside_the_last_step_only(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/sim_step_cost.py", "--num-envs", "1", "--rounds", "2", "--suite", "libero_goal",
         "--with-frames", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())
    assert row["num_envs"] == 1 and len(row["chunk_round_s"]) == 2 and len(row["frames_chunk_round_s"]) == 2
    # 16 renders of both cameras per chunk instead of one: never cheaper, whatever the machine
    assert row["frames_warm_ms_per_env_step"] > row["warm_ms_per_env_step"] > 0
    assert row["frames_over_last_step_only"] == pytest.approx(
        row["frames_warm_ms_per_env_step"] / row["warm_ms_per_env_step"])
