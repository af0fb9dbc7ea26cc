"""The embedded backend's noise: each observation of a request draws its own, deterministically.

The worker class runs in-process here (the code each Ray actor runs, without starting Ray), on the
real tiny Cosmos3 diffusers pipeline on CPU (fp32: the faster CPU dtype), with payloads built by the
real adapter.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from rlinf_cosmos3.actions import write_action_stats
from rlinf_cosmos3.config.rollout import RolloutModelConfig
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.validation.rollout import validate_rollout_model
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
from rlinf_cosmos3.workers.rollout.embedded import EmbeddedPolicyWorker, observation_seed

Q01 = [-0.5, -1.0, 0.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, 0.0]
Q99 = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]
TASK = "pick up the black bowl"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("embedded_noise") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="module")
def served(model_dir: Path) -> tuple[Cosmos3ActionAdapter, EmbeddedPolicyWorker]:
    root = model_dir.parent
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": Q01, "max": Q99, "q01": Q01, "q99": Q99}
    stats = write_action_stats({"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block},
                               root / "stats.json")
    cfg = validate_rollout_model(RolloutModelConfig(model_path=str(model_dir), action_stats_path=str(stats),
                                                    action_normalization="quantile_rot", num_inference_steps=2,
                                                    precision="fp32"))
    return Cosmos3ActionAdapter(cfg, batching_max_size=4), EmbeddedPolicyWorker(str(model_dir), "fp32")


def _payload(adapter: Cosmos3ActionAdapter, main: np.ndarray, wrist: np.ndarray, seed: int | None = None) -> dict:
    (group,) = adapter.request_groups({"main_images": main, "wrist_images": wrist,
                                       "task_descriptions": [TASK] * len(main)})
    payload = adapter.build_request(group)
    if seed is not None:
        payload = copy.deepcopy(payload)
        payload["parameters"]["seed"] = seed
    return payload


def test_each_observation_gets_its_own_deterministic_noise(served) -> None:
    adapter, worker = served
    rng = np.random.default_rng(0)
    main = np.repeat(rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8), 2, axis=0)
    wrist = np.repeat(rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8), 2, axis=0)
    payload = _payload(adapter, main, wrist)  # two identical observations in one request
    seed = payload["parameters"]["seed"]

    actions = worker.generate(payload)
    assert actions.shape == (2, 16, 10) and np.isfinite(actions).all()
    assert not np.allclose(actions[0], actions[1]), "identical observations of one request shared their noise"
    np.testing.assert_array_equal(worker.generate(payload), actions)  # the same request, the same actions
    # observation 1 draws what a one-observation request with the derived seed draws
    single = worker.generate(_payload(adapter, main[1:], wrist[1:], seed=observation_seed(seed, 1)))
    np.testing.assert_array_equal(single[0], actions[1])
    assert observation_seed(seed, 0) == seed != observation_seed(seed, 1)


def test_policy_predict_samples_what_the_embedded_backend_serves(served, model_dir: Path) -> None:
    """``Cosmos3Policy.predict`` (open-loop checks) and the embedded backend share one sampling call
    (``models/cosmos3/inference.predict_actions``): the same observation and seed give the same chunk."""
    from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy

    adapter, worker = served
    rng = np.random.default_rng(1)
    main = rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8)
    wrist = rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8)
    payload = _payload(adapter, main, wrist, seed=7)
    served_actions = worker.generate(payload)[0]
    policy = Cosmos3Policy.from_pretrained(model_dir)
    predicted = policy.predict(main[0], wrist[0], TASK, seed=7, num_inference_steps=2).float().numpy()
    np.testing.assert_allclose(predicted, served_actions, atol=1e-5)
    assert np.abs(served_actions).max() > 0
