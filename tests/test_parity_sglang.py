"""Which flow shift the real SGLang server (0.5.23, ``.venv-sglang``) applies to our action requests.

One CPU server for the tiny model, started by the production server group. Its log prints the
shift of every request's schedule (``Prepared N timesteps (flow_shift=...)``): with the request's
``flow_shift`` (what the adapter sends, 5.0) and without it (SGLang's own action default, 10.0,
although the model's ``scheduler_config.json`` says 5.0). A ``cosmos_framework``-style request (the
longer NVIDIA eval description as the task) is served too.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import numpy as np
import pytest

from rlinf_cosmos3.actions import write_action_stats
from rlinf_cosmos3.config.rollout import RolloutModelConfig, SGLangConfig
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.validation.rollout import validate_rollout_model
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.sglang_group import SGLangServerGroup

pytestmark = [pytest.mark.slow, pytest.mark.sglang]

TASK = "pick up the black bowl and place it on the plate"


def test_sglang_applies_the_flow_shift_the_request_carries(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path / "tiny", preset="tiny", seed=0)
    assert json.loads((model_dir / "scheduler" / "scheduler_config.json").read_text())["flow_shift"] == 5.0
    q01, q99 = [-1.0] * 9 + [0.0], [1.0] * 9 + [1.0]
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": q01, "max": q99, "q01": q01, "q99": q99}
    stats = write_action_stats({"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block},
                               tmp_path / "stats.json")
    model_cfg = validate_rollout_model(RolloutModelConfig(model_path=str(model_dir), action_stats_path=str(stats),
                                                          action_normalization="quantile_rot", num_inference_steps=2))
    rng = np.random.default_rng(0)
    obs = {"main_images": rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8),
           "wrist_images": rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8), "task_descriptions": [TASK]}
    adapter = Cosmos3ActionAdapter(model_cfg, batching_max_size=1)
    (group,) = adapter.request_groups(obs)
    ours = adapter.build_request(group)
    assert ours["parameters"]["flow_shift"] == 5.0
    server_default = copy.deepcopy(ours)
    del server_default["parameters"]["flow_shift"]
    nvidia_cfg = copy.copy(model_cfg)
    nvidia_cfg.caption_style = "cosmos_framework"
    nvidia = Cosmos3ActionAdapter(nvidia_cfg, batching_max_size=1)

    log_dir = tmp_path / "logs"
    sglang = SGLangConfig(num_servers=1, gpus_per_server=0, batching_max_size=1, health_timeout_s=600.0,
                          http_timeout_s=300.0, base_port=32000)
    with SGLangServerGroup(model_cfg, sglang, log_dir=log_dir) as servers:
        (shifted,) = asyncio.run(servers.generate([ours]))  # one at a time: the log lines come in this order
        (unshifted,) = asyncio.run(servers.generate([server_default]))
        nvidia_actions = asyncio.run(nvidia.predict(obs, servers))

    log = "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.rglob("*.log")))
    prepared = [line.split("flow_shift=")[1].rstrip(")") for line in log.splitlines()
                if "timesteps (flow_shift=" in line]
    assert prepared[:2] == ["5.0", "10.0"], prepared
    a5, a10 = (adapter.parse_response(r, group) for r in (shifted, unshifted))
    assert not np.allclose(a5, a10)
    assert nvidia_actions.shape == (1, 16, 7) and np.isfinite(nvidia_actions).all()
