"""Cosmos3ActionAdapter conventions end to end, plus the rollout config and wire codec.

Model outputs are chosen by hand and the expected LIBERO commands are worked out by hand in the
comments (de-normalisation, Gram-Schmidt, rot6d -> axis-angle, the gripper tie), not recomputed
with the library. Grouping uses the real tokenizer of the tiny model (built by the same code that
writes the tiny diffusers directory); that the groups are what the real SGLang server accepts is
checked in test_rollout_sglang.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgpack
import numpy as np
import pytest

from rlinf_cosmos3.actions import write_action_stats
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.rollout import (
    EmbeddedConfig,
    RolloutModelConfig,
    SGLangConfig,
)
from rlinf_cosmos3.models.cosmos3.observation import VIEW_POINT, compose_observation
from rlinf_cosmos3.validation.rollout import validate_rollout_model
from rlinf_cosmos3.workers.rollout import codec
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter, RequestGroup
from rlinf_cosmos3.workers.rollout.protocol import SamplingSettings, response_actions

# global_raw quantiles per channel: dpos x, y, z | rot6d (6) | gripper.
Q01 = [-0.5, -1.0, 0.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, 0.0]
Q99 = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]

SHORT_A = "pick up the black bowl"
SHORT_B = "pick up the black mug"  # same token length as SHORT_A in the tiny tokenizer
LONG = "pick up the alphabet soup and place it in the basket"


def _stats(fps: int = 20, chunk_length: int = 16) -> dict:
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": Q01, "max": Q99, "q01": Q01, "q99": Q99}
    identity = dict(block, q01=[-1.0] * 10, q99=[1.0] * 10)  # must NOT be used by quantile_rot
    return {"metadata": {"fps": fps, "chunk_length": chunk_length}, "global": identity, "global_raw": block}


@pytest.fixture(scope="module")
def stats_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_action_stats(_stats(), tmp_path_factory.mktemp("stats") / "stats.json")


def _model_cfg(adapter_model_dir: Path, stats_path: Path, **overrides) -> RolloutModelConfig:
    cfg = RolloutModelConfig(model_path=str(adapter_model_dir), action_stats_path=str(stats_path),
                             action_normalization="quantile_rot", num_inference_steps=2)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


@pytest.fixture()
def adapter(adapter_model_dir: Path, stats_path: Path) -> Cosmos3ActionAdapter:
    return Cosmos3ActionAdapter(validate_rollout_model(_model_cfg(adapter_model_dir, stats_path)), batching_max_size=2)


def _obs(tasks: list[str], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = len(tasks)
    return {"main_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "task_descriptions": tasks}


def _group(n: int) -> RequestGroup:
    return RequestGroup(np.arange(n), ("t",) * n, np.zeros((n, 192, 320, 3), np.uint8), 1)


# ----------------------------------------------------------------------------- action conventions


def test_hand_worked_model_output_to_libero_actions(adapter_model_dir: Path, stats_path: Path) -> None:
    # Worked by hand with the Gram-Schmidt decode (tests/test_parity_* check the default SVD decode).
    adapter = Cosmos3ActionAdapter(validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, rot6d_decode="gram_schmidt")),
                                   batching_max_size=2)
    out = np.zeros((1, 16, 12), dtype=np.float32)
    out[..., 10:] = 1e6  # channels past raw_action_dim (padding) must be ignored
    # Position: a = (a_n + 1) / 2 * (q99 - q01) + q01.
    out[0, :, 0:3] = [0.0, 1.0, -0.5]  # -> x = 0.0, y = 1.0, z = 0.25 * 2 + 0 = 0.5
    # Rotation (rot6d columns c0 | c1, normalised by q01=-2, q99=2, i.e. a = 2 a_n):
    out[0, 0, 3:9] = [0.5, 0, 0, 0, 0.5, 0]  # c0=(1,0,0), c1=(0,1,0): identity -> (0, 0, 0)
    out[0, 1, 3:9] = [0, 1.0, 0, -0.5, 0.5, 0]  # c0=(0,2,0), c1=(-1,1,0): Gram-Schmidt -> (0,1,0),(-1,0,0):
    # 90 deg about +z -> (0, 0, pi/2)
    out[0, 2, 3:9] = [0.5, 0, 0, 0, 0, 0.5]  # c0=(1,0,0), c1=(0,0,1): 90 deg about +x -> (pi/2, 0, 0)
    out[0, 3:, 3:9] = [0.5, 0, 0, 0, -0.5, 0]  # c0=(1,0,0), c1=(0,-1,0): 180 deg about x -> (pi, 0, 0)
    # Gripper: g = (a_n + 1) / 2; g > 0.5 -> -1 (open), else +1 (close, tie included).
    out[0, :, 9] = 0.2  # g = 0.6 -> open
    out[0, 1, 9] = 0.0  # g = 0.5 exactly: the tie closes
    out[0, 2, 9] = -0.2  # g = 0.4 -> close
    out[0, 3, 9] = 1.0  # g = 1.0 -> open

    actions = adapter.parse_response(out, _group(1))

    assert actions.shape == (1, 16, 7) and actions.dtype == np.float32
    a = actions[0]
    np.testing.assert_allclose(a[:, 0:3], np.tile([0.0, 1.0, 0.5], (16, 1)), atol=1e-6)
    np.testing.assert_allclose(a[0, 3:6], [0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(a[1, 3:6], [0, 0, math.pi / 2], atol=1e-6)
    np.testing.assert_allclose(a[2, 3:6], [math.pi / 2, 0, 0], atol=1e-6)
    np.testing.assert_allclose(np.abs(a[3:, 3]), math.pi, atol=1e-5)  # +pi and -pi are the same rotation
    np.testing.assert_allclose(a[3:, 4:6], 0, atol=1e-5)
    assert a[:4, 6].tolist() == [-1.0, 1.0, 1.0, -1.0]
    assert (a[4:, 6] == -1.0).all()


def test_parse_response_reads_raw_and_envelope(adapter: Cosmos3ActionAdapter) -> None:
    normalized = np.zeros((2, 16, 10), dtype=np.float32)
    normalized[..., 3:9] = [0.5, 0, 0, 0, 0.5, 0]
    normalized[1, :, 0] = 1.0  # env 1 moves +x by q99 = 0.5
    raw = {"actions": normalized, "domain_id": 5, "raw_action_dim": 10}
    envelope = {"object": "action.generation", "data": [
        {"input_index": i, "action": {"values": normalized[i].tolist(), "domain_id": 5, "raw_action_dim": 10}}
        for i in (1, 0)]}  # out of order on purpose
    from_raw = adapter.parse_response(raw, _group(2))
    np.testing.assert_array_equal(from_raw, adapter.parse_response(envelope, _group(2)))
    np.testing.assert_allclose(from_raw[:, 0, 0], [0.0, 0.5], atol=1e-6)
    # A single image's raw answer has no batch axis.
    np.testing.assert_array_equal(adapter.parse_response({"actions": normalized[1]}, _group(1)), from_raw[1:])
    with pytest.raises(ValueError, match="domain_id=7"):
        adapter.parse_response(dict(raw, domain_id=7), _group(2))
    with pytest.raises(ValueError, match="for a batch of 3"):
        adapter.parse_response(raw, _group(3))
    bad = normalized.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        adapter.parse_response(bad, _group(2))


# ----------------------------------------------------------------------------- grouping and order


def test_groups_by_token_length_and_splits_at_batch_limit(adapter: Cosmos3ActionAdapter) -> None:
    lengths = adapter.token_lengths
    assert lengths(SHORT_A) == lengths(SHORT_B) != lengths(LONG)
    tasks = [SHORT_A, LONG, SHORT_B, SHORT_A, LONG, " pick up the black mug ", SHORT_A]
    obs = _obs(tasks)
    groups = adapter.request_groups(obs)
    # 5 short (stripped) prompts -> 2 + 2 + 1; 2 long -> 2.
    assert sorted(len(g) for g in groups) == [1, 2, 2, 2]
    assert sorted(np.concatenate([g.env_indices for g in groups]).tolist()) == list(range(len(tasks)))
    canvases = compose_observation(obs["main_images"], obs["wrist_images"], channels_last=True)
    for group in groups:
        assert len({lengths(p) for p in group.prompts}) == 1
        assert {lengths(p) for p in group.prompts} == {group.token_length}
        assert group.prompts == tuple(tasks[i].strip() for i in group.env_indices)
        np.testing.assert_array_equal(group.images, canvases[group.env_indices])
    short = [g for g in groups if g.token_length == lengths(SHORT_A)]
    assert [g.env_indices.tolist() for g in short] == [[0, 2], [3, 5], [6]]  # env order kept inside a length


def test_build_request_sends_every_parameter(adapter: Cosmos3ActionAdapter) -> None:
    group = adapter.request_groups(_obs([SHORT_A, SHORT_B]))[0]
    payload = adapter.build_request(group)
    assert payload["input"]["task"] == [SHORT_A, SHORT_B]
    image = payload["input"]["observation"]["image"]
    assert image.shape == (2, 192, 320, 3) and image.dtype == np.uint8
    assert payload["parameters"] == {
        "action_mode": "policy", "domain_name": "libero", "domain_id": 5, "raw_action_dim": 10,
        "action_horizon": 16, "num_frames": 17, "num_inference_steps": 2, "height": 192, "width": 320,
        "fps": 20, "seed": 42, "guidance_scale": 1.0, "action_view_point": "concat_view", "flow_shift": 5.0}
    assert payload["runtime"] == {"response_format": "raw"}


def test_sampling_settings_are_read_from_the_config() -> None:
    """Each request parameter comes from its rollout.model field (distinct values, so none is mixed up)."""
    cfg = RolloutModelConfig(num_inference_steps=5, height=256, width=384, fps=10, seed=7, guidance_scale=2.0,
                             view_point="single_view", flow_shift=3.0, num_action_chunks=8, num_frames=9)
    assert SamplingSettings.of(cfg) == SamplingSettings(
        domain_name="libero", raw_action_dim=10, action_horizon=8, num_inference_steps=5, height=256, width=384,
        fps=10, seed=7, guidance_scale=2.0, view_point="single_view", flow_shift=3.0)


def test_restore_order_with_shuffled_groups(adapter: Cosmos3ActionAdapter) -> None:
    tasks = [SHORT_A, LONG, SHORT_B, LONG, SHORT_A, SHORT_B, LONG]
    groups = adapter.request_groups(_obs(tasks))
    # Each group's result row b carries the env index it belongs to.
    results = [np.broadcast_to(g.env_indices[:, None, None], (len(g), 16, 7)).astype(np.float32) for g in groups]
    order = np.random.default_rng(3).permutation(len(groups))
    restored = Cosmos3ActionAdapter.restore_order([groups[i] for i in order], [results[i] for i in order], len(tasks))
    assert restored.shape == (len(tasks), 16, 7)
    np.testing.assert_array_equal(restored[:, 0, 0], np.arange(len(tasks)))
    with pytest.raises(ValueError, match=r"envs \[\d+"):
        Cosmos3ActionAdapter.restore_order(groups[:-1], results[:-1], len(tasks))


# ----------------------------------------------------------------------------- config


def test_missing_stats_or_method_is_an_error(adapter_model_dir: Path, stats_path: Path) -> None:
    with pytest.raises(ConfigError, match="rollout.model.action_stats_path"):
        validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, action_stats_path="???"))
    with pytest.raises(ConfigError, match="rollout.model.action_stats_path.*not found"):
        validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, action_stats_path=str(adapter_model_dir / "nope.json")))
    with pytest.raises(ConfigError, match="rollout.model.action_normalization.*required"):
        validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, action_normalization="???"))
    with pytest.raises(ConfigError, match="unknown method 'quantile'"):
        validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, action_normalization="quantile"))
    with pytest.raises(ValueError, match="action_stats_path is required"):
        Cosmos3ActionAdapter(_model_cfg(adapter_model_dir, stats_path, action_stats_path=""), batching_max_size=2)
    with pytest.raises(ValueError, match="action_normalization is required"):
        Cosmos3ActionAdapter(_model_cfg(adapter_model_dir, stats_path, action_normalization="???"), batching_max_size=2)


def test_model_identity_mismatches_are_errors(adapter_model_dir: Path, stats_path: Path, tmp_path: Path) -> None:
    other_fps = write_action_stats(_stats(fps=10), tmp_path / "stats10.json")
    with pytest.raises(ConfigError, match="computed with fps=10"):
        validate_rollout_model(_model_cfg(adapter_model_dir, other_fps))
    with pytest.raises(ConfigError, match="num_frames"):
        validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, num_frames=16))
    with pytest.raises(ConfigError, match="raw_action_dim"):
        validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, raw_action_dim=7))
    with pytest.raises(ConfigError, match="height"):
        validate_rollout_model(_model_cfg(adapter_model_dir, stats_path, height=200))
    with pytest.raises(ConfigError, match="model_index.json"):
        validate_rollout_model(_model_cfg(tmp_path, stats_path))


def test_serving_configs_validate(tmp_path: Path) -> None:
    assert RolloutModelConfig().view_point == VIEW_POINT  # the caption framing the canvas was composed for
    assert SGLangConfig().validate().interpreter.is_file()
    with pytest.raises(ConfigError, match="rollout.sglang.python.*not found"):
        SGLangConfig(python=str(tmp_path / "python")).validate()
    with pytest.raises(ConfigError, match="gpu_ids"):
        SGLangConfig(num_servers=2, gpus_per_server=1, gpu_ids=[0]).validate()
    with pytest.raises(ConfigError, match="response_format"):
        SGLangConfig(response_format="json").validate()
    with pytest.raises(ConfigError, match="gpus_per_worker"):
        EmbeddedConfig(gpus_per_worker=2).validate()


# ----------------------------------------------------------------------------- wire codec


def test_codec_round_trips_and_reads_bytes_keys() -> None:
    images = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
    payload = {"input": {"observation": {"image": images}}, "seed": np.int64(3)}
    decoded = codec.decode_msgpack(codec.encode_msgpack(payload))
    np.testing.assert_array_equal(decoded["input"]["observation"]["image"], images)
    assert decoded["seed"] == 3
    # SGLang's responses pack arrays with bytes keys.
    actions = np.linspace(-1, 1, 16 * 10, dtype=np.float32).reshape(16, 10)
    server_style = msgpack.packb({"actions": {b"__ndarray__": True, b"data": actions.tobytes(),
                                              b"dtype": actions.dtype.str, b"shape": actions.shape}},
                                 use_bin_type=True)
    body = codec.decode(server_style, "application/msgpack")
    np.testing.assert_array_equal(response_actions(body)[0], actions)
    body["actions"][0, 0] = 5.0  # decoded arrays are writable copies
    as_json = json.loads(codec.encode_json({"image": images}))
    assert np.array_equal(np.asarray(as_json["image"], dtype=np.uint8), images)  # a list of images
