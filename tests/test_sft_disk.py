"""The SFT driver and disk space: refused before Ray when one checkpoint cannot fit, stopped cleanly
when the next will not, and ``runner.max_checkpoints_to_keep`` applied (the resume dir is kept).

Real runs of the driver entry ``run_sft`` in-process (real tiny Cosmos3, recorded LIBERO demos, Ray
ranks with FSDP2 over gloo), and the driver's start-up check on its own. The only fault injected is
the driver's free-space probe reporting a full disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.checkpoint import disk as disk_module
from rlinf_cosmos3.checkpoint import list_checkpoints
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.runners.checkpoint_space import plan_checkpoints, preflight
from rlinf_cosmos3.runners.sft_runner import run_sft
from rlinf_cosmos3.validation.sft import load_sft_config

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = "libero_sft_cosmos3_tiny"


@pytest.fixture(scope="module")
def sft_inputs(recorded_libero_dataset, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sft_disk")
    episodes = read_lerobot_episode_actions(recorded_libero_dataset.root)
    stats = compute_action_stats(episodes.episodes, metadata={"fps": recorded_libero_dataset.fps})
    return {
        "model": write_model_dir(root / "tiny_model", preset="tiny", seed=0),
        "stats": write_action_stats(stats, root / "stats.json"),
        "data": recorded_libero_dataset.root,
    }


def _cfg(inputs: dict[str, Path], workdir: Path, *extra: str):
    overrides = [f"actor.model.model_path={inputs['model']}", f"data.dataset.root={inputs['data']}",
                 f"data.dataset.stats_path={inputs['stats']}", f"runner.log_path={workdir / 'ckpts'}",
                 f"runner.logs_dir={workdir / 'logs'}", "actor.optim.total_training_steps=10",
                 "actor.optim.lr_warmup_steps=2", "data.num_workers=0", *extra]
    with initialize_config_dir(config_dir=str(REPO / "examples/sft/config"), version_base=None):
        return compose(EXPERIMENT, overrides=overrides)


def _run_log(workdir: Path, config_name: str) -> str:
    (run_dir,) = [p for p in (workdir / "logs").iterdir() if p.name.endswith(config_name)]
    return (run_dir / "run_embodiment.log").read_text()


@pytest.mark.slow
@pytest.mark.libero
def test_start_is_refused_before_ray_when_one_checkpoint_cannot_fit(sft_inputs, tmp_path, monkeypatch) -> None:
    import ray

    cfg = _cfg(sft_inputs, tmp_path, "runner.max_steps=4", "runner.save_interval=2")
    free = 10 * 2**20
    monkeypatch.setattr(disk_module, "free_bytes", lambda path: free)  # the fault: a nearly full disk
    assert run_sft(cfg, config_name="full_disk") == 2

    log = _run_log(tmp_path, "full_disk")
    root = tmp_path / "ckpts" / EXPERIMENT / "checkpoints"
    required = plan_checkpoints(load_sft_config(OmegaConf.to_container(cfg, resolve=True))).size.required
    assert free < required  # the tiny checkpoint (~11 MiB) plus its margin does not fit in 10 MiB
    assert "refusing to start: not enough disk space" in log and str(root) in log
    assert f"{required:,} bytes" in log and f"{free:,} bytes" in log and "global_step_2" in log
    assert "point runner.log_path at a filesystem with room" in log
    assert "cluster:" not in log and "starting" not in log  # no Ray, no ranks
    assert not ray.is_initialized()
    assert not root.exists()


@pytest.mark.slow
@pytest.mark.libero
def test_retention_and_a_disk_that_fills_up_mid_run(sft_inputs, tmp_path, monkeypatch) -> None:
    root = tmp_path / "ckpts" / EXPERIMENT / "checkpoints"
    real_free_bytes = disk_module.free_bytes

    def filling_disk(path):  # the fault: the disk is full once global_step_3 is written
        return 1024 if (root / "global_step_3").exists() else real_free_bytes(path)

    monkeypatch.setattr(disk_module, "free_bytes", filling_disk)
    cfg = _cfg(sft_inputs, tmp_path, "runner.max_steps=5", "runner.save_interval=1",
               "runner.max_checkpoints_to_keep=2")
    assert run_sft(cfg, config_name="filling") == 2
    assert [p.name for p in list_checkpoints(root)] == ["global_step_2", "global_step_3"]
    assert sorted(p.name for p in root.iterdir()) == ["global_step_2", "global_step_3"]
    log = _run_log(tmp_path, "filling")
    assert "deleted old checkpoint" in log and "global_step_1" in log
    assert "stopped: not enough disk space" in log and "global_step_4" in log
    assert f"Nothing is lost: {root / 'global_step_3'} is complete" in log
    assert "lower runner.max_checkpoints_to_keep (now 2)" in log
    assert "step 4/5" not in log  # stopped before paying for the steps of a save that cannot be written

    # Free space again and resume from the newest: with keep=1 the resume dir still survives.
    monkeypatch.setattr(disk_module, "free_bytes", real_free_bytes)
    cfg = _cfg(sft_inputs, tmp_path, "runner.max_steps=5", "runner.save_interval=1",
               "runner.max_checkpoints_to_keep=1", f"runner.resume_dir={root / 'global_step_3'}")
    assert run_sft(cfg, config_name="resumed") == 0
    assert [p.name for p in list_checkpoints(root)] == ["global_step_3", "global_step_5"]
    assert "the run resumed from it" in _run_log(tmp_path, "resumed")

    # A new run from scratch into the same directory would save over them: refused before any step is paid for.
    assert run_sft(_cfg(sft_inputs, tmp_path, "runner.max_steps=5", "runner.save_interval=1"), config_name="again") == 2
    log = _run_log(tmp_path, "again")
    assert "already holds complete checkpoints of an earlier run" in log and "global_step_3, global_step_5" in log
    assert f"runner.resume_dir={root / 'global_step_5'}" in log
    assert "step 1/5" not in log
    assert [p.name for p in list_checkpoints(root)] == ["global_step_3", "global_step_5"]


# ---------------------------------------------------------------- the start-up check alone (fast)


@pytest.fixture(scope="module")
def cfg_inputs(recorded_libero_dataset, tiny_model_and_stats) -> dict[str, Path]:
    """A tiny model, a stats file and the session's recorded dataset (validation reads its meta/info.json)."""
    return {"model": tiny_model_and_stats.model, "stats": tiny_model_and_stats.stats,
            "data": recorded_libero_dataset.root}


def _typed(inputs: dict[str, Path], workdir: Path, *extra: str):
    return load_sft_config(OmegaConf.to_container(_cfg(inputs, workdir, *extra), resolve=True))


def test_preflight_warns_when_the_checkpoints_kept_at_once_will_not_fit(cfg_inputs, tmp_path, monkeypatch,
                                                                        caplog) -> None:
    cfg = _typed(cfg_inputs, tmp_path, "runner.max_steps=10", "runner.save_interval=2")  # 5 saves
    size = plan_checkpoints(cfg).size
    monkeypatch.setattr(disk_module, "free_bytes", lambda path: 2 * size.total + size.required)  # room for 3
    with caplog.at_level("WARNING", logger="rlinf_cosmos3.sft"):
        preflight(cfg)  # keep all: 5 will not fit
    assert "the 5 new checkpoints this run will hold at once" in caplog.text
    assert "set runner.max_checkpoints_to_keep" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlinf_cosmos3.sft"):
        preflight(_typed(cfg_inputs, tmp_path, "runner.max_steps=10", "runner.save_interval=2",
                         "runner.max_checkpoints_to_keep=2"))  # at most 3 at once: they fit
    assert "will hold at once" not in caplog.text


def test_preflight_reports_a_bad_trainable_selection_as_a_config_error(cfg_inputs, tmp_path) -> None:
    cfg = _typed(cfg_inputs, tmp_path, "actor.model.keys_to_select=[no_such_module]")
    with pytest.raises(ConfigError, match=r"actor.model.keys_to_select.*no_such_module"):
        preflight(cfg)
