"""Checkpoints and disk space: the size estimate against real saves, full-disk errors, retention.

Real saves throughout (the tiny Cosmos3, single-process and FSDP2 over 2 gloo ranks; the toy model).
Monkeypatching only injects the faults: a free-space probe reporting a full disk, an ENOSPC or a
torch short write in the middle of a save, a failure in the middle of a deletion.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp_module
from dist_helpers import Toy, run_on_ranks
from omegaconf import OmegaConf

from rlinf_cosmos3.checkpoint import (
    CheckpointError,
    InsufficientSpaceError,
    TrainerState,
    delete_checkpoint,
    estimate_checkpoint_size,
    is_complete_checkpoint,
    list_checkpoints,
    model_footprint,
    prune_checkpoints,
    save_checkpoint,
)
from rlinf_cosmos3.checkpoint import disk as disk_module
from rlinf_cosmos3.checkpoint import retention as retention_module
from rlinf_cosmos3.checkpoint.layout import full_weights_path
from rlinf_cosmos3.components.ema import PowerEMA
from rlinf_cosmos3.components.optim import build_optimizer, lambda_linear_schedule, select_trainable
from rlinf_cosmos3.models.cosmos3 import loading
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

REPO = Path(__file__).resolve().parent.parent
RECIPE = OmegaConf.to_container(OmegaConf.load(REPO / "examples/sft/config/model/cosmos3.yaml"))
TOLERANCE = 0.03  # the estimate must be within 3 % of du


def du(path: Path) -> int:
    """Bytes allocated under ``path``, as the ``du`` tool counts them."""
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def file_bytes(path: Path) -> int:
    return path.stat().st_blocks * 512


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny") / "model", preset="tiny", seed=0)


def _train_one_step(transformer, ema_enabled: bool):
    """The recipe's selection, param groups, AdamW step, schedule and EMA on a tiny transformer."""
    select_trainable(transformer, RECIPE["keys_to_select"])
    opt = build_optimizer(transformer, 1e-3, 0.05, lr_multipliers=RECIPE["lr_multipliers"])
    for param in transformer.parameters():
        if param.requires_grad:
            param.grad = torch.full_like(param, 1e-3)
    opt.step()
    sched = lambda_linear_schedule(opt, 2, 10)
    sched.step()
    ema = PowerEMA(transformer, enabled=ema_enabled)
    ema.update(1)
    return opt, sched, ema


# ---------------------------------------------------------------- the estimate against real saves


@pytest.mark.parametrize("ema_enabled, full_weights", [(True, True), (False, False)])
def test_estimate_matches_a_real_single_process_save(tiny_model, tmp_path, ema_enabled, full_weights) -> None:
    transformer = loading.load_transformer(tiny_model)
    opt, sched, ema = _train_one_step(transformer, ema_enabled)
    step_dir = save_checkpoint(tmp_path, transformer, opt, TrainerState(global_step=1), sched, ema,
                               save_full_weights=full_weights)
    estimate = estimate_checkpoint_size(model_footprint(transformer), world_size=1, ema=ema_enabled,
                                        full_weights=full_weights)
    actual = du(step_dir)
    assert abs(estimate.total - actual) <= TOLERANCE * actual, (estimate, actual)
    assert estimate.required > actual
    if full_weights:
        assert abs(estimate.full_weights - file_bytes(full_weights_path(step_dir))) <= 0.01 * estimate.full_weights
        assert abs(estimate.full_weights_ema - file_bytes(full_weights_path(step_dir, ema=True))) \
            <= 0.01 * estimate.full_weights_ema
    else:
        assert estimate.full_weights == estimate.full_weights_ema == 0
    dcp_bytes = du(step_dir / "actor" / "dcp")
    dcp_estimate = estimate.resume_model + estimate.resume_optimizer + estimate.resume_ema
    assert abs(dcp_estimate - dcp_bytes) <= TOLERANCE * dcp_bytes, (dcp_estimate, dcp_bytes)

    # The driver's footprint (meta device, built from the model dir's config, same selection) is the
    # one of the model that was trained and saved.
    meta = loading.build_transformer_on_meta(tiny_model)
    select_trainable(meta, RECIPE["keys_to_select"])
    assert model_footprint(meta) == model_footprint(transformer)


def _fsdp2_save_rank(rank: int, world_size: int, model_dir: str, ckpt: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from rlinf_cosmos3.models.cosmos3.parallelize import ParallelizeConfig, parallelize

    transformer = loading.build_transformer_on_meta(model_dir)
    parallelize(transformer, init_device_mesh("cpu", (world_size,)), ParallelizeConfig())
    loading.load_transformer_weights(transformer, model_dir, device="cpu")
    opt, sched, ema = _train_one_step(transformer, ema_enabled=True)
    save_checkpoint(ckpt, transformer, opt, TrainerState(global_step=1), sched, ema)
    if rank == 0:
        estimate = estimate_checkpoint_size(model_footprint(transformer), world_size=world_size, ema=True)
        Path(ckpt, "estimate.txt").write_text(str(estimate.total))


def test_estimate_matches_a_real_fsdp2_save_on_2_ranks(tiny_model, tmp_path) -> None:
    ckpt = tmp_path / "checkpoints"
    run_on_ranks(tmp_path, _fsdp2_save_rank, str(tiny_model), str(ckpt))
    estimate = int((ckpt / "estimate.txt").read_text())
    actual = du(ckpt / "global_step_1")
    assert abs(estimate - actual) <= TOLERANCE * actual, (estimate, actual)


def test_nano_checkpoint_size_in_the_docs_is_the_estimators(tmp_path) -> None:
    """docs/sft.md quotes the Nano checkpoint; it must be what the estimator says for the recipe."""
    nano = write_model_dir(tmp_path / "nano", preset="nano")  # configs only
    meta = loading.build_transformer_on_meta(nano)
    selection = select_trainable(meta, RECIPE["keys_to_select"])
    assert selection.n_trainable + selection.n_frozen == 15_173_136_576
    size = estimate_checkpoint_size(model_footprint(meta), world_size=8, ema=True)
    docs = (REPO / "docs" / "sft.md").read_text()
    gib = 2**30
    for value in (size.total, size.full_weights, size.full_weights_ema, size.resume_state):
        assert f"{value / gib:.1f} GiB" in docs, value / gib
    assert f"{10 * size.total / 2**40:.2f} TiB" in docs  # 5,000 steps, save_interval 500, keep all


# ---------------------------------------------------------------- a full disk during the write


def _ckpt_listing(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir())


def test_enospc_in_the_sharded_write_says_the_disk_is_full(tmp_path, monkeypatch) -> None:
    model = Toy()
    opt, sched, ema = _toy_training(model)
    first = save_checkpoint(tmp_path, model, opt, TrainerState(global_step=1), sched, ema)

    def full_disk_write(self, plan, planner):  # the fault: the filesystem is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "global_step_2.tmp"))

    monkeypatch.setattr(dcp_module.FileSystemWriter, "write_data", full_disk_write)
    with pytest.raises(InsufficientSpaceError) as info:
        save_checkpoint(tmp_path, model, opt, TrainerState(global_step=2), sched, ema)
    message = str(info.value)
    needed = estimate_checkpoint_size(model_footprint(model), world_size=1, ema=True).total
    assert "global_step_2" in message and str(tmp_path) in message
    assert "filesystem is full" in message and "No space left on device" in message
    assert f"{needed:,} bytes" in message and "were free when the save started" in message
    assert "runner.log_path" in message and "runner.max_checkpoints_to_keep" in message
    assert _ckpt_listing(tmp_path) == ["global_step_1"]  # temp dir removed, nothing complete-looking
    assert list_checkpoints(tmp_path) == [first]


def test_torch_short_write_is_a_full_disk_only_when_the_probe_confirms(tmp_path, monkeypatch) -> None:
    model = Toy()
    opt, sched, ema = _toy_training(model)
    real_save = torch.save

    def short_write(obj, f, *args, **kwargs):  # the fault: torch's zip writer runs out of room
        if str(f).endswith("full_weights.pt"):
            Path(f).write_bytes(b"\0" * 4096)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2824907328 vs 2824907216")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", short_write)
    # Plenty of room on this disk: the same text is some other I/O fault, reported as it is.
    with pytest.raises(CheckpointError, match="unexpected pos") as info:
        save_checkpoint(tmp_path, model, opt, TrainerState(global_step=1), sched, ema)
    assert not isinstance(info.value, InsufficientSpaceError)
    assert _ckpt_listing(tmp_path) == []

    # The probe finds the disk full: now it says so, with both numbers.
    monkeypatch.setattr(disk_module, "free_bytes", lambda path: 1024)
    with pytest.raises(InsufficientSpaceError, match="filesystem is full") as info:
        save_checkpoint(tmp_path, model, opt, TrainerState(global_step=1), sched, ema)
    assert "unexpected pos" in str(info.value) and "1,024 bytes (1.0 KiB) were free" in str(info.value)
    assert _ckpt_listing(tmp_path) == []


@pytest.fixture
def small_filesystem(tmp_path):
    """Mount a real tmpfs of a given size (root only; skipped where mounting is not allowed)."""
    mounted: list[Path] = []

    def mount(size_bytes: int) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        # Lazy: the test still holds the failed writer's traceback (pytest.raises, log capture), hence its open file.
        subprocess.run(["umount", "--lazy", str(point)], check=True)


@pytest.mark.parametrize("room", ["none", "resume_state_only"])
def test_a_really_full_filesystem_is_reported_as_such(tiny_model, small_filesystem, room) -> None:
    """No fault injected: a real filesystem too small for the checkpoint. With no room, the sharded
    write fails with ENOSPC; with room for the resume state only, torch's zip writer fails writing
    full_weights.pt with its errno-less "unexpected pos" (the reported fault), confirmed by the probe."""
    transformer = loading.load_transformer(tiny_model)
    opt, sched, ema = _train_one_step(transformer, ema_enabled=True)
    size = estimate_checkpoint_size(model_footprint(transformer), world_size=1, ema=True)
    dcp_bytes = size.resume_model + size.resume_optimizer + size.resume_ema
    ckpt = small_filesystem(2**20 if room == "none" else dcp_bytes + 2**20) / "checkpoints"
    with pytest.raises(InsufficientSpaceError, match="filesystem is full") as info:
        save_checkpoint(ckpt, transformer, opt, TrainerState(global_step=1), sched, ema)
    message = str(info.value)
    assert ("No space left on device" if room == "none" else "unexpected pos") in message
    assert f"{size.total:,} bytes" in message and str(ckpt) in message
    assert _ckpt_listing(ckpt) == []  # the temp dir is removed, nothing complete-looking is left


def _toy_training(model: torch.nn.Module):
    select_trainable(model, ["layers", "llm2action"])
    opt = build_optimizer(model, 1e-2, 0.05)
    model(torch.randn(4, 4)).square().mean().backward()
    opt.step()
    sched = lambda_linear_schedule(opt, 2, 8)
    ema = PowerEMA(model)
    ema.update(1)
    return opt, sched, ema


def _enospc_rank(rank: int, world_size: int, ckpt: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = Toy()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt, sched, ema = _toy_training(model)
    save_checkpoint(ckpt, model, opt, TrainerState(global_step=1), sched, ema)
    if rank == 1:  # the fault: rank 1's share of the sharded write finds the disk full

        def full_disk_write(self, plan, planner):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        dcp_module.FileSystemWriter.write_data = full_disk_write
    with pytest.raises(InsufficientSpaceError, match="global_step_2 could not be written .* filesystem is full"):
        save_checkpoint(ckpt, model, opt, TrainerState(global_step=2), sched, ema)
    dist.barrier()


def test_enospc_on_one_rank_is_a_full_disk_on_every_rank(tmp_path) -> None:
    ckpt = tmp_path / "checkpoints"
    run_on_ranks(tmp_path, _enospc_rank, str(ckpt))
    assert _ckpt_listing(ckpt) == ["global_step_1"]


# ---------------------------------------------------------------- retention


def _saved_steps(ckpt: Path, steps: list[int]) -> list[Path]:
    model = Toy()
    opt, sched, ema = _toy_training(model)
    return [save_checkpoint(ckpt, model, opt, TrainerState(global_step=s), sched, ema) for s in steps]


def test_retention_keeps_the_newest_k_and_the_resume_dir(tmp_path) -> None:
    paths = _saved_steps(tmp_path, [1, 2, 3, 4, 5])
    (tmp_path / "global_step_9").mkdir()  # incomplete: not a checkpoint, not counted, not touched
    deleted = prune_checkpoints(tmp_path, 2, protect=[paths[1]])
    assert deleted == [paths[0], paths[2]]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["global_step_2", "global_step_4", "global_step_5"]
    assert _ckpt_listing(tmp_path) == ["global_step_2", "global_step_4", "global_step_5", "global_step_9"]
    assert prune_checkpoints(tmp_path, 2, protect=[paths[1]]) == []  # idempotent
    assert prune_checkpoints(tmp_path, 1) == [paths[1], paths[3]]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(tmp_path, 0)


def test_an_interrupted_deletion_leaves_nothing_that_looks_complete(tmp_path, monkeypatch) -> None:
    paths = _saved_steps(tmp_path, [1, 2, 3])
    real_rmtree = shutil.rmtree

    def rmtree_dies_halfway(path, *args, **kwargs):  # the fault: removal stops after one file
        victim = next(p for p in sorted(Path(path).rglob("*")) if p.is_file() and p.name != "COMPLETE")
        victim.unlink()
        raise OSError(errno.EIO, "Input/output error (injected)", str(path))

    monkeypatch.setattr(retention_module.shutil, "rmtree", rmtree_dies_halfway)
    with pytest.raises(OSError, match="injected"):
        delete_checkpoint(paths[0])
    assert [p.name for p in list_checkpoints(tmp_path)] == ["global_step_2", "global_step_3"]
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith("global_step_1")]
    assert len(leftovers) == 1 and leftovers[0].name.startswith("global_step_1.old-")
    assert (leftovers[0] / "COMPLETE").is_file()  # the marker survived, yet nothing accepts the dir
    assert not any(is_complete_checkpoint(p) for p in leftovers)

    # Through retention the failure is logged and skipped; the next save removes the stale leftover.
    assert prune_checkpoints(tmp_path, 1) == []
    monkeypatch.setattr(retention_module.shutil, "rmtree", real_rmtree)
    _saved_steps(tmp_path, [4])
    assert not any(p.name.startswith(("global_step_1.", "global_step_2.")) for p in tmp_path.iterdir())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["global_step_3", "global_step_4"]


def test_delete_checkpoint_refuses_other_directories(tmp_path) -> None:
    (tmp_path / "notes").mkdir()
    with pytest.raises(ValueError, match="not a global_step"):
        delete_checkpoint(tmp_path / "notes")
    assert (tmp_path / "notes").is_dir()
