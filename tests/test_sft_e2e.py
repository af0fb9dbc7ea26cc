"""SFT end to end on CPU: real LIBERO demos, real tiny Cosmos3, real Ray ranks with FSDP2 over gloo.

One straight run (via the launcher script) provides checkpoints; a resumed run from its middle
checkpoint must reproduce the straight run's losses and final weights exactly; conversion turns
the final checkpoint into a diffusers directory with the same weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.checkpoint import is_complete_checkpoint, load_full_weights
from rlinf_cosmos3.checkpoint.layout import full_weights_path
from rlinf_cosmos3.models.cosmos3.identity import file_sha256, read_identity
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.libero]

REPO = Path(__file__).resolve().parent.parent
STEPS = 4


@pytest.fixture(scope="module")
def sft_inputs(recorded_libero_dataset, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sft")
    episodes = read_lerobot_episode_actions(recorded_libero_dataset.root)
    stats = compute_action_stats(episodes.episodes, metadata={"fps": recorded_libero_dataset.fps})
    return {
        "root": root,
        "model": write_model_dir(root / "tiny_model", preset="tiny", seed=0),
        "stats": write_action_stats(stats, root / "stats.json"),
        "data": recorded_libero_dataset.root,
    }


def _overrides(inputs: dict[str, Path], log_path: Path, *extra: str) -> list[str]:
    return [f"actor.model.model_path={inputs['model']}", f"data.dataset.root={inputs['data']}",
            f"data.dataset.stats_path={inputs['stats']}", f"runner.log_path={log_path}",
            f"runner.logs_dir={log_path.parent / 'logs'}",
            f"runner.max_steps={STEPS}", "runner.save_interval=2", "actor.optim.total_training_steps=10",
            "actor.optim.lr_warmup_steps=2", "data.num_workers=0", *extra]


def _losses(run_dir: Path) -> list[float]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [s.value for s in events.Scalars("train/loss")]


@pytest.fixture(scope="module")
def straight_run(sft_inputs, tmp_path_factory) -> dict[str, Path]:
    cwd = tmp_path_factory.mktemp("straight")
    log_path = cwd / "ckpts"
    proc = subprocess.run(
        ["bash", str(REPO / "examples/sft/run_vla_sft.sh"), "libero_sft_cosmos3_tiny", *_overrides(sft_inputs, log_path)],
        cwd=cwd, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (run_dir,) = list((cwd / "logs").iterdir())
    return {"cwd": cwd, "run_dir": run_dir, "ckpts": log_path / "libero_sft_cosmos3_tiny" / "checkpoints",
            "stdout": proc.stdout + proc.stderr}


def test_straight_run_outputs(straight_run, sft_inputs) -> None:
    run_dir, ckpts = straight_run["run_dir"], straight_run["ckpts"]
    assert run_dir.name.endswith("-libero_sft_cosmos3_tiny")
    log = (run_dir / "run_embodiment.log").read_text()
    assert "saved checkpoint" in log and f"step {STEPS}/{STEPS}" in log
    assert (run_dir / "config.yaml").is_file()
    losses = _losses(run_dir)
    assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses)))
    assert sorted(p.name for p in ckpts.iterdir()) == ["global_step_2", "global_step_4"]
    assert all(is_complete_checkpoint(p) for p in ckpts.iterdir())

    weights = torch.load(full_weights_path(ckpts / "global_step_4"), weights_only=True)
    from diffusers import Cosmos3OmniTransformer

    base = Cosmos3OmniTransformer.from_pretrained(Path(sft_inputs["model"]) / "transformer")
    assert set(weights) == set(base.state_dict())
    changed = [k for k, v in base.state_dict().items() if not torch.equal(v, weights[k].to(v.dtype))]
    assert changed, "training did not change any weight"
    assert full_weights_path(ckpts / "global_step_4", ema=True).is_file()
    # every checkpoint carries the run's training identity, the stats file hashed
    for step in ckpts.iterdir():
        identity = read_identity(step)
        assert identity is not None and identity.stats_sha256 == file_sha256(sft_inputs["stats"])
        assert (identity.fps, identity.action_horizon, identity.num_frames, identity.canvas_height,
                identity.canvas_width, identity.view_point) == (20, 16, 17, 192, 320, "concat_view")


def test_resume_reproduces_straight_run(straight_run, sft_inputs, tmp_path) -> None:
    from hydra import compose, initialize_config_dir

    from rlinf_cosmos3.runners.sft_runner import run_sft

    log_path = tmp_path / "ckpts"
    resume = straight_run["ckpts"] / "global_step_2"
    with initialize_config_dir(config_dir=str(REPO / "examples/sft/config"), version_base=None):
        cfg = compose("libero_sft_cosmos3_tiny", overrides=_overrides(sft_inputs, log_path, f"runner.resume_dir={resume}"))
    assert run_sft(cfg, config_name="resumed") == 0
    (run_dir,) = list((tmp_path / "logs").iterdir())
    assert "resumed from" in (run_dir / "run_embodiment.log").read_text()

    assert _losses(run_dir) == _losses(straight_run["run_dir"])[2:]
    straight = load_full_weights(straight_run["ckpts"] / "global_step_4")
    resumed = load_full_weights(log_path / "libero_sft_cosmos3_tiny" / "checkpoints" / "global_step_4")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_invalid_config_fails_before_any_worker(sft_inputs, tmp_path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "examples/sft/run_vla_sft.sh"), "libero_sft_cosmos3_tiny",
         *_overrides(sft_inputs, tmp_path / "ckpts", "actor.global_batch_size=3")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert "actor.global_batch_size" in proc.stdout + proc.stderr
    assert "starting" not in proc.stdout


def test_convert_checkpoint_round_trip(straight_run, sft_inputs, tmp_path) -> None:
    step = straight_run["ckpts"] / "global_step_4"
    out = tmp_path / "converted"
    for ema, target in ((False, out), (True, tmp_path / "converted_ema")):
        args = ["--src", str(full_weights_path(step)), "--base", str(sft_inputs["model"]), "--out", str(target)]
        proc = subprocess.run([sys.executable, str(REPO / "toolkits/cosmos3/convert_checkpoint.py"), *args,
                               *(["--use-ema-weights"] if ema else [])], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        expected = load_full_weights(step, ema=ema)
        from diffusers import Cosmos3OmniTransformer

        loaded = Cosmos3OmniTransformer.from_pretrained(target / "transformer").state_dict()
        assert all(torch.equal(loaded[k], expected[k]) for k in expected), f"weights differ (ema={ema})"
    assert read_identity(out) == read_identity(step) is not None  # the converter carries the identity
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline"
    assert (out / "vae").is_dir() and (out / "text_tokenizer").is_dir() and (out / "scheduler").is_dir()
    proc = subprocess.run([sys.executable, str(REPO / "toolkits/cosmos3/convert_checkpoint.py"), "--src",
                           str(full_weights_path(step)), "--base", str(sft_inputs["model"]), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "exists" in proc.stderr


@pytest.mark.sglang
def test_converted_model_is_served_and_hot_swapped_by_sglang(straight_run, sft_inputs, tmp_path) -> None:
    """The real SGLang server (CPU) serves the converted directory, and accepts it as an in-place
    transformer update of the base model (update_weights_from_disk changes the weights checksum).

    Known limit (sglang 0.5.23, measured): the checksum after the in-place update differs from the one
    of a server started on the converted directory; see docs/sft.md. So evaluation starts servers on
    the converted directory and does not rely on hot swapping."""
    import httpx

    from rlinf_cosmos3.checkpoint.export import export_diffusers
    from rlinf_cosmos3.config.rollout import RolloutModelConfig, SGLangConfig
    from rlinf_cosmos3.workers.rollout.sglang_group import SGLangServerGroup

    converted = export_diffusers(full_weights_path(straight_run["ckpts"] / "global_step_4"), sft_inputs["model"],
                                 tmp_path / "converted")
    assert read_identity(converted) is not None  # the served directory holds model_identity.json
    serving = SGLangConfig(num_servers=1, gpus_per_server=0, health_timeout_s=600, batching_max_size=2)

    def checksum(url: str) -> str:
        reply = httpx.post(f"{url}/get_weights_checksum", json={"module_names": ["transformer"]}, timeout=300)
        reply.raise_for_status()
        return reply.json()["transformer"]

    def model_cfg(path: Path) -> RolloutModelConfig:
        return RolloutModelConfig(model_path=str(path), action_stats_path=str(sft_inputs["stats"]),
                                  action_normalization="quantile_rot")

    with SGLangServerGroup(model_cfg(converted), serving, log_dir=tmp_path / "srv_converted") as group:
        served_converted = checksum(group.urls[0])
    with SGLangServerGroup(model_cfg(sft_inputs["model"]), serving, log_dir=tmp_path / "srv_base") as group:
        url = group.urls[0]
        base = checksum(url)
        reply = httpx.post(f"{url}/update_weights_from_disk",
                           json={"model_path": str(converted), "target_modules": ["transformer"]}, timeout=600)
        assert reply.status_code == 200 and reply.json()["success"], reply.text
        swapped = checksum(url)
    assert base != swapped, "update_weights_from_disk did not change the transformer"
    assert served_converted != base, "the server did not load the converted (trained) transformer"
