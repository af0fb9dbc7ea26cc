"""EmbeddedPolicyBackend: diffusers' Cosmos3OmniPipeline in a real Ray actor, through the same adapter.

The actor serves the same payload the SGLang backend posts; its output for a request must equal a
direct pipeline call with that request's canvas, prompt, steps, fps, seed, guidance 1.0 and no
system prompt (and differ once the system prompt is switched on, so the setting is not moot).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniPipeline

from rlinf_cosmos3.actions import write_action_stats
from rlinf_cosmos3.cluster import Cluster, ClusterConfig
from rlinf_cosmos3.config.rollout import EmbeddedConfig, RolloutModelConfig
from rlinf_cosmos3.models.cosmos3.action_condition import policy_condition
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.validation.rollout import validate_rollout_model
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.factory import make_backend

pytestmark = [pytest.mark.slow]

Q01 = [-0.5, -1.0, 0.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, 0.0]
Q99 = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]
TASKS = ["pick up the black bowl", "pick up the alphabet soup and place it in the basket", "pick up the black mug"]


@pytest.fixture(scope="module")
def model_cfg(tmp_path_factory: pytest.TempPathFactory) -> RolloutModelConfig:
    root = tmp_path_factory.mktemp("embedded_rollout")
    model_dir = write_model_dir(root / "tiny", preset="tiny", seed=0)
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": Q01, "max": Q99, "q01": Q01, "q99": Q99}
    stats = write_action_stats({"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block},
                               root / "stats.json")
    return validate_rollout_model(RolloutModelConfig(model_path=str(model_dir), action_stats_path=str(stats),
                                                     action_normalization="quantile_rot", num_inference_steps=2))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # Ray's unix socket paths must stay short.
    temp_dir = Path(f"/tmp/rre{os.getpid()}_{time.monotonic_ns() % 10**6}")
    with Cluster(ClusterConfig(num_cpus=2, num_gpus=0, object_store_memory_mb=100, temp_dir=str(temp_dir))) as c:
        yield c
    subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


def _obs(tasks: list[str], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = len(tasks)
    return {"main_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "task_descriptions": tasks}


def test_embedded_backend_through_the_adapter(model_cfg: RolloutModelConfig, cluster: Cluster,
                                               tmp_path: Path) -> None:
    adapter = Cosmos3ActionAdapter(model_cfg, batching_max_size=4)
    obs = _obs(TASKS)
    groups = adapter.request_groups(obs)
    payload = adapter.build_request(groups[0])
    embedded = EmbeddedConfig(num_workers=1, gpus_per_worker=0, cpus_per_worker=1.0)
    with make_backend("embedded", model_cfg, embedded_cfg=embedded, log_dir=tmp_path, cluster=cluster) as backend:
        actions = asyncio.run(adapter.predict(obs, backend))
        (served,) = asyncio.run(backend.generate([payload]))

    assert actions.shape == (3, 16, 7) and actions.dtype == np.float32
    assert np.isfinite(actions).all()
    assert set(np.unique(actions[..., 6])) <= {-1.0, 1.0}
    assert not np.allclose(actions[0], actions[1])
    assert served.shape == (len(groups[0]), 16, 10) and served.dtype == np.float32

    pipe = Cosmos3OmniPipeline.from_pretrained(model_cfg.model_path, enable_safety_checker=False,
                                               dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)

    def direct(system_prompt: bool) -> np.ndarray:
        out = pipe(prompt=groups[0].prompts[0], action=policy_condition(groups[0].images[0], view_point="concat_view"),
                   num_inference_steps=2, fps=20.0, guidance_scale=1.0,
                   generator=torch.Generator().manual_seed(model_cfg.seed), output_type="latent",
                   use_system_prompt=system_prompt)
        return out.action[0].float().numpy()

    np.testing.assert_array_equal(served[0], direct(system_prompt=False))
    assert not np.allclose(served[0], direct(system_prompt=True))
