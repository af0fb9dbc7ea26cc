"""Checkpoints: layout rules, exact save/load and resume, atomicity — on real FSDP2 with 2 gloo ranks.

The distributed tests spawn ranks through a forkserver that preloads torch, so only the first
spawn in a pytest process pays the import cost.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_helpers import Toy, run_on_ranks

from rlinf_cosmos3.checkpoint import (
    CheckpointError,
    TrainerState,
    full_weights_path,
    is_complete_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_full_weights,
    save_checkpoint,
)
from rlinf_cosmos3.components.ema import PowerEMA
from rlinf_cosmos3.components.optim import (
    build_optimizer,
    clip_grad_norm,
    lambda_linear_schedule,
    select_trainable,
)

# ---------------------------------------------------------------- helpers






def _build(seed: int, sharded: bool, dtype: torch.dtype = torch.float32):
    """Model (FSDP2 per layer then root when ``sharded``), optimizer, scheduler, EMA — as a fresh run."""
    with torch.random.fork_rng():  # the weights come from ``seed``; the caller's RNG streams go on
        torch.manual_seed(seed)
        model = Toy().to(dtype)
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    select_trainable(model, ["layers", "llm2action"])  # time_embedder stays frozen
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.05, lr_multipliers={"llm2action": 5.0})
    sched = lambda_linear_schedule(opt, warmup_steps=2, total_steps=8, f_start=0.1)
    ema = PowerEMA(model, rate=0.1)
    return model, opt, sched, ema


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


DATA = torch.linspace(-1, 1, 64 * 4).reshape(64, 4)
PER_RANK = 4


def _train(model, opt, sched, ema, state: TrainerState, steps: int) -> list[float]:
    """Toy SFT loop whose batches come from the data position and whose noise uses all three RNGs."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    losses = []
    for _ in range(steps):
        start = state.sample_offset + rank * PER_RANK
        x = DATA[start : start + PER_RANK] + 0.01 * torch.randn(PER_RANK, 4)
        x = x.to(next(model.parameters()).dtype)
        target = torch.from_numpy(np.random.standard_normal((PER_RANK, 3))).to(x.dtype)
        weight = 1.0 + random.random()
        loss = (model(x) - target).square().mean() * weight
        loss.backward()
        clip_grad_norm(model, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        state.global_step += 1
        ema.update(state.global_step)
        state.consumed_samples += PER_RANK * world
        state.sample_offset += PER_RANK * world
        if state.sample_offset + PER_RANK * world > len(DATA):
            state.epoch, state.sample_offset = state.epoch + 1, 0
        losses.append(loss.item())
    return losses


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _assert_same_training_state(a, b) -> None:
    """Bit-identical parameters, optimizer state and param groups, scheduler and EMA shadow."""
    (model_a, opt_a, sched_a, ema_a), (model_b, opt_b, sched_b, ema_b) = a, b
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters(), strict=True):
        assert torch.equal(_local(pa), _local(pb)), name
    for pa, pb in zip(model_a.parameters(), model_b.parameters(), strict=True):
        sa, sb = opt_a.state.get(pa, {}), opt_b.state.get(pb, {})
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(_local(sa[key]), _local(sb[key])), key
    for ga, gb in zip(opt_a.param_groups, opt_b.param_groups, strict=True):
        assert {k: v for k, v in ga.items() if k != "params"} == {
            k: v for k, v in gb.items() if k != "params"
        }
    assert sched_a.state_dict() == sched_b.state_dict()
    assert sched_a.get_last_lr() == sched_b.get_last_lr()
    assert ema_a.shadow.keys() == ema_b.shadow.keys()
    for name in ema_a.shadow:
        assert torch.equal(ema_a.shadow[name], ema_b.shadow[name]), name


def _rng_draws() -> tuple:
    return random.random(), float(np.random.standard_normal()), torch.rand(3).tolist()


# ---------------------------------------------------------------- layout rules (no processes)


def _fake_complete(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "COMPLETE").write_text("{}")
    return path


def test_latest_checkpoint_accepts_only_complete_exact_names(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    _fake_complete(tmp_path / "global_step_2")
    _fake_complete(tmp_path / "global_step_10")
    (tmp_path / "global_step_30").mkdir()  # no marker
    _fake_complete(tmp_path / "global_step_40.tmp-0123abcd")  # temp name, even with a marker
    _fake_complete(tmp_path / "global_step_50_copy")
    _fake_complete(tmp_path / "global_step_x")
    (tmp_path / "global_step_60").write_text("a file")
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_10"  # numeric, not lexical, order
    assert [p.name for p in list_checkpoints(tmp_path)] == ["global_step_2", "global_step_10"]
    assert not is_complete_checkpoint(tmp_path / "global_step_30")


# ---------------------------------------------------------------- single process


def test_single_process_round_trip_overwrite_and_stale_cleanup(tmp_path: Path, caplog) -> None:
    _seed_all(0)
    run = _build(0, sharded=False, dtype=torch.bfloat16)
    state = TrainerState(global_step=0, extra={"note": "toy"})
    _train(*run, state, 3)
    ckpt = tmp_path / "checkpoints"
    stale = ckpt / "global_step_1.tmp-deadbeef"
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    with caplog.at_level(logging.WARNING, logger="rlinf_cosmos3.checkpoint"):
        step_dir = save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])
    assert not stale.exists() and "global_step_1.tmp-deadbeef" in caplog.text
    assert step_dir == ckpt / "global_step_3" and latest_checkpoint(ckpt) == step_dir
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_3"]

    # export: the model's own state dict keys, dtypes as trained (bf16), EMA copy in fp32
    full = torch.load(full_weights_path(step_dir), weights_only=True)
    assert list(full) == list(run[0].state_dict())
    for key, value in run[0].state_dict().items():
        assert value.dtype == full[key].dtype == torch.bfloat16 and torch.equal(value, full[key])
    ema_full = load_full_weights(step_dir, ema=True)
    assert list(ema_full) == list(full) and all(v.dtype == torch.float32 for v in ema_full.values())
    assert torch.equal(ema_full["llm2action.weight"], run[3].shadow["llm2action.weight"])

    draws = _rng_draws()
    _seed_all(99)
    fresh = _build(7, sharded=False, dtype=torch.bfloat16)
    loaded = load_checkpoint(step_dir, *fresh)
    assert _rng_draws() == draws
    assert loaded == TrainerState(
        global_step=3, epoch=0, sample_offset=12, consumed_samples=12, extra={"note": "toy"}
    )
    _assert_same_training_state(run, fresh)

    with pytest.raises(CheckpointError, match="overwrite=True"):
        save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])
    _train(*run, state, 1)
    state.global_step = 3  # same step again, different weights
    save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3], overwrite=True)
    assert torch.equal(load_full_weights(step_dir)["llm2action.bias"], run[0].llm2action.bias)
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_3"]


def test_incomplete_directories_are_refused(tmp_path: Path) -> None:
    run = _build(0, sharded=False)
    step_dir = save_checkpoint(tmp_path, run[0], run[1], TrainerState(global_step=1), run[2], run[3])
    (step_dir / "COMPLETE").unlink()
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(step_dir, *_build(1, sharded=False))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_full_weights(step_dir)
    # a directory with the right name but no marker is not a checkpoint: a new save replaces it
    save_checkpoint(tmp_path, run[0], run[1], TrainerState(global_step=1), run[2], run[3])
    assert latest_checkpoint(tmp_path) == step_dir


def test_ema_disabled_and_model_only_variants(tmp_path: Path) -> None:
    model, opt, sched, _ = _build(0, sharded=False)
    ema = PowerEMA(model, enabled=False)
    state = TrainerState(global_step=0)
    _train(model, opt, sched, ema, state, 2)
    step_dir = save_checkpoint(tmp_path, model, opt, state, sched, ema)
    assert not full_weights_path(step_dir, ema=True).exists() and full_weights_path(step_dir).exists()
    # resuming with EMA on from a checkpoint without EMA warm-starts it from the loaded weights
    fresh_model, fresh_opt, fresh_sched, fresh_ema = _build(3, sharded=False)
    load_checkpoint(step_dir, fresh_model, fresh_opt, fresh_sched, fresh_ema, restore_rng=False)
    assert torch.equal(fresh_ema.shadow["llm2action.weight"], model.llm2action.weight.detach())
    # weights-only load (no optimizer), e.g. to initialise from a run
    plain = Toy()
    load_checkpoint(step_dir, plain, restore_rng=False)
    assert torch.equal(plain.llm2action.weight, model.llm2action.weight)


# ---------------------------------------------------------------- FSDP2, 2 gloo ranks


def _save_load_rank(rank: int, world_size: int, ckpt: str) -> None:
    _seed_all(100 + rank)
    run = _build(0, sharded=True)
    state = TrainerState(global_step=0, sampler_state={"seed": 42})
    _train(*run, state, 3)
    step_dir = save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])
    draws = _rng_draws()
    unsharded = {k: _full(v) for k, v in run[0].state_dict().items()}
    ema_full = run[3].full_state_dict()

    _seed_all(7)
    fresh = _build(5, sharded=True)
    assert not torch.equal(_local(fresh[0].llm2action.weight), _local(run[0].llm2action.weight))
    loaded = load_checkpoint(step_dir, *fresh)
    assert _rng_draws() == draws  # per-rank RNG streams continue exactly
    assert loaded == state
    _assert_same_training_state(run, fresh)

    if rank == 0:
        full = torch.load(full_weights_path(step_dir), weights_only=True)
        assert list(full) == list(unsharded)
        for key, value in unsharded.items():
            assert torch.equal(full[key], value), key
        saved_ema = load_full_weights(step_dir, ema=True)
        assert list(saved_ema) == list(ema_full)
        for key, value in ema_full.items():
            assert torch.equal(saved_ema[key], value), key


def test_fsdp2_save_then_load_is_bit_identical(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    run_on_ranks(tmp_path, _save_load_rank, str(ckpt))
    step_dir = latest_checkpoint(ckpt)
    assert step_dir == ckpt / "global_step_3"
    assert sorted(p.name for p in (step_dir / "actor" / "rng").iterdir()) == [
        "rank_00000.pt",
        "rank_00001.pt",
    ]
    # the sharded resume state reshards: load the 2-rank checkpoint into one unsharded process
    model, opt, sched, ema = _build(9, sharded=False)
    assert load_checkpoint(step_dir, model, opt, sched, ema, restore_rng=False).global_step == 3
    full = load_full_weights(step_dir)
    for key, value in model.state_dict().items():
        assert torch.equal(value, full[key]), key
    assert sched.last_epoch == 3


def _resume_rank(rank: int, world_size: int, ckpt: str, out: str) -> None:
    n = 3
    _seed_all(100 + rank)
    straight = _build(0, sharded=True)
    state = TrainerState(global_step=0)
    losses_straight = _train(*straight, state, 2 * n)

    _seed_all(100 + rank)
    first = _build(0, sharded=True)
    state = TrainerState(global_step=0)
    losses = _train(*first, state, n)
    step_dir = save_checkpoint(ckpt, first[0], first[1], state, first[2], first[3])
    del first

    _seed_all(12345)  # a new process would start from other RNG states and other weights
    resumed = _build(77, sharded=True)
    state = load_checkpoint(step_dir, *resumed)
    assert state.global_step == n
    losses += _train(*resumed, state, n)

    assert losses == losses_straight  # exact float equality, step by step
    _assert_same_training_state(straight, resumed)
    Path(out, f"losses_{rank}.txt").write_text(repr(losses))


def test_resume_reproduces_uninterrupted_training_exactly(tmp_path: Path) -> None:
    run_on_ranks(tmp_path, _resume_rank, str(tmp_path / "checkpoints"), str(tmp_path))
    losses = [(tmp_path / f"losses_{r}.txt").read_text() for r in range(2)]
    assert losses[0] != losses[1]  # ranks saw different data and noise


def _failing_save_rank(rank: int, world_size: int, ckpt: str) -> None:
    import torch.distributed.checkpoint as dcp_module

    from rlinf_cosmos3.checkpoint import save as save_module

    run = _build(0, sharded=True)
    state = TrainerState(global_step=0)
    _train(*run, state, 1)
    first = save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])
    _train(*run, state, 1)

    # 1) rank 1's storage write fails inside torch.distributed.checkpoint
    original_write = dcp_module.FileSystemWriter.write_data
    if rank == 1:

        def broken_write(self, plan, planner):
            raise OSError("disk full (injected)")

        dcp_module.FileSystemWriter.write_data = broken_write
    with pytest.raises(CheckpointError, match="sharded save of global_step_2 failed"):
        save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])
    dcp_module.FileSystemWriter.write_data = original_write
    dist.barrier()
    assert latest_checkpoint(ckpt) == first and sorted(os.listdir(ckpt)) == ["global_step_1"]
    dist.barrier()  # every rank has looked before rank 0 starts the next save

    # 2) rank 1 raises in its own (non-collective) part of the save
    original_capture = save_module.capture_rng_state
    if rank == 1:

        def broken_capture():
            raise OSError("cannot write RNG state (injected)")

        save_module.capture_rng_state = broken_capture
    with pytest.raises(CheckpointError, match="rank 1: OSError: cannot write RNG state"):
        save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])
    save_module.capture_rng_state = original_capture
    dist.barrier()
    assert latest_checkpoint(ckpt) == first and sorted(os.listdir(ckpt)) == ["global_step_1"]
    dist.barrier()  # every rank has looked before rank 0 starts the next save

    # 3) the process group is still usable and the next save succeeds
    assert save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3]) == Path(ckpt) / "global_step_2"


def test_a_rank_failing_mid_save_leaves_no_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    run_on_ranks(tmp_path, _failing_save_rank, str(ckpt))
    assert [p.name for p in list_checkpoints(ckpt)] == ["global_step_1", "global_step_2"]


def _killed_save_rank(rank: int, world_size: int, ckpt: str) -> None:
    from rlinf_cosmos3.checkpoint import save as save_module

    run = _build(0, sharded=True)
    state = TrainerState(global_step=0)
    _train(*run, state, 1)
    save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])
    _train(*run, state, 1)
    if rank == 0:
        # the process dies after every rank wrote its files, just before the rename
        save_module._publish = lambda tmp, final, marker: os._exit(17)
    save_checkpoint(ckpt, run[0], run[1], state, run[2], run[3])


def test_a_kill_before_rename_leaves_only_a_stale_temp_dir(tmp_path: Path, caplog) -> None:
    ckpt = tmp_path / "checkpoints"
    with pytest.raises(torch.multiprocessing.ProcessExitedException, match="exit code 17"):
        run_on_ranks(tmp_path, _killed_save_rank, str(ckpt))
    leftovers = sorted(p.name for p in ckpt.iterdir())
    assert leftovers[0] == "global_step_1" and len(leftovers) == 2
    assert leftovers[1].startswith("global_step_2.tmp-")
    assert (ckpt / leftovers[1] / "actor" / "model_state_dict" / "full_weights.pt").is_file()  # written...
    assert latest_checkpoint(ckpt) == ckpt / "global_step_1"  # ...but never accepted
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(ckpt / leftovers[1], Toy())
    # the next save (here a single-process one) removes the stale temp dir, with a log line
    model, opt, sched, ema = _build(0, sharded=False)
    with caplog.at_level(logging.WARNING, logger="rlinf_cosmos3.checkpoint"):
        save_checkpoint(ckpt, model, opt, TrainerState(global_step=2), sched, ema)
    assert leftovers[1] in caplog.text
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_1", "global_step_2"]
