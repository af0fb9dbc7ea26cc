"""``benchmarks/sft_op_count.py``: its arithmetic (slopes, the CPU-only attention loop left out, the extrapolation
to 128 samples, the side-by-side table) on made-up counts, and one real run of the tiny preset (slow)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "sft_op_count.py"


@pytest.fixture(scope="module")
def op_count() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sft_op_count", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _counts(n: int) -> dict:
    """A step of ``n`` samples: 100 fixed ops, 3 per sample in the loss, 10 per sample in the CPU attention loop
    (forward and backward), one sync; Python calls alike."""
    return {
        "ops": 100 + 3 * n + 10 * n + 4,
        "ops_by_line": {"models/cosmos3/policy.py:loss_from_encoded:300": 100 + 3 * n,
                        "models/cosmos3/packed_attention.py:_sdpa:189": 6 * n,
                        "models/cosmos3/packed_attention.py:_sdpa:189 (backward)": 4 * n,
                        "models/cosmos3/packed_attention.py:_loop:130": 4},
        "syncs": {"components/optim.py:clip_grad_norm_:281": 1},
        "python_calls": 1000 + 5 * n, "builtin_calls": 500 + 2 * n, "calls_in_cpu_attention_loop": 3 * n + 1,
        "time_s": {"step_s": 0.1 * n},
    }


def test_report_leaves_the_cpu_attention_loop_out_and_extrapolates(op_count: ModuleType) -> None:
    result = op_count.report({8: _counts(8), 16: _counts(16)}, top=5)
    assert result["ops_per_extra_sample"] == 13
    assert result["gpu_path_ops_per_step"] == {8: 124, 16: 148}
    assert result["gpu_path_ops_per_extra_sample"] == 3 and result["gpu_path_fixed_ops_per_step"] == 100
    assert result["at_micro_batch"] == {"micro_batch": 128, "gpu_path_ops": 100 + 3 * 128,
                                        "gpu_path_calls": 1500 + 4 * 128 - 1}
    assert result["host_syncs"] == {8: 1, 16: 1}
    assert all(not op_count._is_cpu_only(line) for line in result["top_lines_per_step"])
    table = op_count.side_by_side({"before": result, "after": result})
    assert table[0].split() == ["before", "after"]
    assert any(line.startswith("GPU path: ops per extra sample") and line.split()[-2:] == ["3.0", "3.0"]
               for line in table)


@pytest.mark.slow
def test_tiny_run_counts_a_real_step(tmp_path: Path) -> None:
    out = tmp_path / "ops.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--micro-batches", "2", "3", "--timed", "1", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())["this tree"]
    assert result["gpu_path_ops_per_extra_sample"] == 0  # no operation grows with the samples but the CPU loop
    assert result["host_syncs"]["3"] <= 4
    assert result["time_s"]["3"]["step_s"] > 0
