"""``benchmarks/_common.py``, what the benchmark scripts share: a real one-rank gloo process group, JSON
reports written to disk and read back, the time budget on the real clock, and the machine description."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmarks_common", REPO / "benchmarks" / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_one_rank_process_group_runs_collectives_and_is_destroyed(common: ModuleType) -> None:
    import torch
    import torch.distributed as dist

    assert not dist.is_initialized()
    with common.one_rank_process_group("cpu"):
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
        value = torch.tensor([3.0])
        dist.all_reduce(value)
        assert value.item() == 3.0
    assert not dist.is_initialized()

    with pytest.raises(RuntimeError, match="inside"), common.one_rank_process_group(torch.device("cpu")):
        raise RuntimeError("inside")
    assert not dist.is_initialized()  # torn down on an error too, so the next group can start
    with common.one_rank_process_group():
        assert dist.get_world_size() == 1
    assert not dist.is_initialized()


def test_write_json_round_trips_and_keeps_the_old_report_on_failure(common: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "report.json"  # folders are made
    data = {"path": tmp_path, "array": np.arange(3), "scalar": np.float32(0.5), "nested": {"n": 1}}
    assert common.write_json(out, data) == out
    text = out.read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "path"')  # indent 2 by default
    assert json.loads(text) == {"path": str(tmp_path), "array": [0, 1, 2], "scalar": 0.5, "nested": {"n": 1}}

    common.write_json(out, {"a": [1]}, indent=1)
    assert out.read_text() == '{\n "a": [\n  1\n ]\n}\n'
    with pytest.raises(TypeError, match="cannot write object"):
        common.write_json(out, {"a": object()})
    assert json.loads(out.read_text()) == {"a": [1]}  # the previous report is whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.json"]  # no temporary file left


def test_budget_on_the_real_clock(common: ModuleType) -> None:
    unbounded = common.Budget(None)
    assert not unbounded.spent() and unbounded.phase_end(0.5) == float("inf")
    assert unbounded.elapsed() >= 0

    budget = common.Budget(0.2)
    deadline = budget.phase_end(0.5)  # half of the ~0.2 s left
    assert time.monotonic() + 0.05 < deadline < budget.end
    assert not budget.spent()
    time.sleep(0.25)
    assert budget.spent() and budget.elapsed() >= 0.25
    assert budget.phase_end(0.5) <= time.monotonic()  # nothing left to share

    zero = common.Budget(0)  # zero is a budget, spent at once; only None means none
    time.sleep(0.01)
    assert zero.spent()


def test_machine_description_and_result_names(common: ModuleType) -> None:
    import torch

    info = common.host_info()
    assert set(info) == {"host", "cpu_count", "platform", "python"} and info["cpu_count"] >= 1
    versions = common.library_versions()
    assert versions["torch"] == torch.__version__ and set(versions) == {"torch", "diffusers", "cuda", "python"}
    assert common.device_slug("cpu") == common.device_slug(torch.device("cpu")) == "cpu"
    assert common.device_name("cpu").startswith("cpu (")
    assert common.device_memory_gib("cpu") is None

    path = common.results_path("sft_step", "cpu")
    assert path.parent == REPO / "benchmarks" / "results"
    assert path.name.startswith("sft_step_cpu_20") and path.suffix == ".json"
    assert len(path.stem) == len("sft_step_cpu_") + 8
    assert common.results_path("serve_actions", "h200", "20261129_101500").name == (
        "serve_actions_h200_20261129_101500.json")
