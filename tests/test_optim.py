"""Optimizer, LambdaLinear schedule and gradient clipping — on real torch modules and real FSDP2.

The distributed test spawns 2 gloo ranks on CPU through a forkserver that preloads torch, so
only the first spawn in a pytest process pays the import cost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_on_ranks
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from rlinf_cosmos3.components.optim import (
    build_optimizer,
    build_param_groups,
    clean_param_name,
    clip_grad_norm,
    lambda_linear_factor,
    lambda_linear_schedule,
    select_trainable,
)

# ---------------------------------------------------------------- helpers


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.und = nn.Linear(dim, dim)
        self.moe_gen = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moe_gen(torch.tanh(self.und(self.norm(x))))


class Toy(nn.Module):
    """Cosmos-like parameter names (``moe_gen``, ``time_embedder``, ``llm2action``), uneven shards."""

    def __init__(self, dim: int = 5, n_layers: int = 2, out: int = 3) -> None:
        super().__init__()
        self.time_embedder = nn.Linear(4, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.llm2action = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.time_embedder(x)
        for layer in self.layers:
            h = layer(h)
        return self.llm2action(h)




# ---------------------------------------------------------------- LambdaLinear schedule


def _cosmos_lambda_linear(n: int, warm: int, cycle: int, f_start: float, f_max: float, f_min: float) -> float:
    """cosmos-framework LambdaLinearScheduler.schedule, single cycle, written out by hand."""
    if n < warm:
        return (f_max - f_start) / warm * n + f_start
    return f_min + (f_max - f_min) * (cycle - n) / (cycle - warm)


def test_lambda_linear_key_points() -> None:
    kw = dict(warmup_steps=10, total_steps=110, f_start=1e-6, f_max=1.0, min_lr_rate=0.0)
    assert lambda_linear_factor(0, **kw) == pytest.approx(1e-6, abs=1e-15)  # step 0: f_start
    assert lambda_linear_factor(5, **kw) == pytest.approx(1e-6 + (1 - 1e-6) * 0.5)
    assert lambda_linear_factor(9, **kw) == pytest.approx(
        1e-6 + (1 - 1e-6) * 0.9
    )  # last warm-up step < f_max
    assert lambda_linear_factor(10, **kw) == 1.0  # warm-up end: f_max exactly
    assert lambda_linear_factor(60, **kw) == pytest.approx(0.5)  # mid-decay
    assert lambda_linear_factor(110, **kw) == 0.0  # end: min_lr_rate
    assert lambda_linear_factor(111, **kw) == 0.0  # past end: flat
    assert lambda_linear_factor(10_000, **kw) == 0.0
    floor = dict(kw, min_lr_rate=0.1)
    assert lambda_linear_factor(60, **floor) == pytest.approx(0.55)
    assert lambda_linear_factor(110, **floor) == pytest.approx(0.1)
    assert lambda_linear_factor(500, **floor) == pytest.approx(0.1)
    # no warm-up (the LIBERO smoke recipe): starts at f_max and decays from step 0
    assert lambda_linear_factor(0, warmup_steps=0, total_steps=100) == 1.0
    assert lambda_linear_factor(25, warmup_steps=0, total_steps=100) == pytest.approx(0.75)


def test_lambda_linear_matches_cosmos_formula_everywhere() -> None:
    for warm, total, f_start, f_max, f_min in [
        (10, 110, 1e-6, 1.0, 0.0),
        (0, 7, 1e-6, 1.0, 0.0),
        (3, 4, 0.1, 2.0, 0.5),
    ]:
        for n in range(total + 1):
            expected = _cosmos_lambda_linear(n, warm, total, f_start, f_max, f_min)
            assert lambda_linear_factor(n, warm, total, f_start, f_max, f_min) == pytest.approx(
                expected, rel=1e-12
            )


def test_lambda_linear_schedule_drives_each_group_from_its_base_lr() -> None:
    model = Toy()
    opt = build_optimizer(model, lr=0.5, weight_decay=0.0, lr_multipliers={"llm2action": 4.0})
    sched = lambda_linear_schedule(
        opt, warmup_steps=2, total_steps=6, f_start=0.1, f_max=1.0, min_lr_rate=0.2
    )
    base = sorted(g["lr"] / lambda_linear_factor(0, 2, 6, 0.1, 1.0, 0.2) for g in opt.param_groups)
    assert base == pytest.approx([0.5, 2.0])
    for step in range(9):
        factor = lambda_linear_factor(step, 2, 6, 0.1, 1.0, 0.2)
        assert sorted(g["lr"] for g in opt.param_groups) == pytest.approx([0.5 * factor, 2.0 * factor])
        opt.step()
        sched.step()
    # the scheduler's state holds counters and LRs only (the lambda is a plain function)
    state = sched.state_dict()
    assert state["last_epoch"] == 9 and state["lr_lambdas"] == [None, None]


def test_lambda_linear_rejects_bad_lengths() -> None:
    opt = torch.optim.AdamW(nn.Linear(2, 2).parameters())
    with pytest.raises(ValueError, match="warmup_steps < total_steps"):
        lambda_linear_schedule(opt, warmup_steps=10, total_steps=10)
    with pytest.raises(ValueError, match="warmup_steps"):
        lambda_linear_schedule(opt, warmup_steps=-1, total_steps=10)


# ---------------------------------------------------------------- trainable selection, groups


def _names(model: nn.Module, trainable: bool) -> set[str]:
    return {clean_param_name(n) for n, p in model.named_parameters() if p.requires_grad == trainable}


def test_select_trainable_keeps_only_matching_params() -> None:
    model = Toy()
    n_trainable, n_frozen = select_trainable(model, ["moe_gen", "llm2action"])
    expected = {f"layers.{i}.moe_gen.{k}" for i in range(2) for k in ("weight", "bias")}
    expected |= {"llm2action.weight", "llm2action.bias"}
    assert _names(model, True) == expected
    assert n_trainable == 2 * (5 * 5 + 5) + (3 * 5 + 3)
    assert n_trainable + n_frozen == sum(p.numel() for p in model.parameters())
    # selection only narrows: a second call cannot unfreeze what the first froze
    select_trainable(model, ["layers"])
    assert _names(model, True) == {n for n in expected if n.startswith("layers")}


def test_select_trainable_none_or_empty_changes_nothing() -> None:
    model = Toy()
    model.time_embedder.weight.requires_grad_(False)
    for keys in (None, []):
        n_trainable, n_frozen = select_trainable(model, keys)
        assert n_frozen == 4 * 5 and "time_embedder.weight" in _names(model, False)
        assert n_trainable == sum(p.numel() for p in model.parameters()) - 20


def test_select_trainable_unknown_key_is_an_error_naming_it() -> None:
    model = Toy()
    with pytest.raises(ValueError, match="action2llm") as info:
        select_trainable(model, ["moe_gen", "action2llm"])
    assert "moe_gen'" not in str(info.value).split("match")[0]  # only the bad entry is named
    assert all(p.requires_grad for p in model.parameters())  # nothing was frozen on error


def _group_of(groups: list[dict], model: nn.Module) -> dict[str, tuple[float, float]]:
    by_id = {id(p): clean_param_name(n) for n, p in model.named_parameters()}
    return {by_id[id(p)]: (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}


def test_param_groups_multipliers_and_frozen_params() -> None:
    model = Toy()
    select_trainable(model, ["moe_gen", "time_embedder", "llm2action"])
    groups = build_param_groups(model, lr=5e-5, weight_decay=0.05, lr_multipliers={"llm2action": 5.0})
    assignment = _group_of(groups, model)
    assert set(assignment) == _names(model, True)  # frozen params are in no group
    for name, (lr, wd) in assignment.items():
        assert lr == pytest.approx(5e-5 * (5.0 if name.startswith("llm2action") else 1.0))
        assert wd == 0.05  # cosmos default: decay on every tensor, 1-D included
    assert [g["lr"] for g in groups] == sorted(g["lr"] for g in groups)


def test_param_groups_first_match_wins_and_1d_decay_rule() -> None:
    model = Toy()
    groups = build_param_groups(
        model,
        lr=1.0,
        weight_decay=0.1,
        lr_multipliers={"layers.0": 2.0, "layers": 3.0, "moe_gen": 7.0},
        disable_weight_decay_for_1d_params=True,
    )
    assignment = _group_of(groups, model)
    assert assignment["layers.0.moe_gen.weight"] == (2.0, 0.1)  # first key in order wins
    assert assignment["layers.1.moe_gen.weight"] == (3.0, 0.1)
    assert assignment["layers.1.norm.weight"] == (3.0, 0.0)  # 1-D: no decay
    assert assignment["time_embedder.bias"] == (1.0, 0.0)
    assert assignment["time_embedder.weight"] == (1.0, 0.1)
    with pytest.raises(ValueError, match="llm2vae"):
        build_param_groups(model, lr=1.0, weight_decay=0.0, lr_multipliers={"llm2vae": 5.0})


def test_param_groups_match_through_wrapper_prefixes() -> None:
    model = Toy()
    model.layers[0] = checkpoint_wrapper(model.layers[0])
    raw = [n for n, _ in model.named_parameters()]
    assert any("_checkpoint_wrapped_module" in n for n in raw)
    select_trainable(model, ["layers.0.moe_gen"])
    assert _names(model, True) == {"layers.0.moe_gen.weight", "layers.0.moe_gen.bias"}
    groups = build_param_groups(
        model, lr=1.0, weight_decay=0.0, lr_multipliers={"layers.0.moe_gen.bias": 3.0}
    )
    assert _group_of(groups, model) == {
        "layers.0.moe_gen.weight": (1.0, 0.0),
        "layers.0.moe_gen.bias": (3.0, 0.0),
    }


def test_build_optimizer_is_adamw_with_recipe_settings() -> None:
    model = Toy()
    select_trainable(model, ["moe_gen"])
    opt = build_optimizer(model, lr=5e-5, weight_decay=0.05, betas=(0.9, 0.99), eps=1e-8)
    assert isinstance(opt, torch.optim.AdamW)
    (group,) = opt.param_groups
    assert group["betas"] == (0.9, 0.99) and group["eps"] == 1e-8 and group["weight_decay"] == 0.05
    assert group["foreach"] is True and not group["fused"]  # CPU params
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(8, 4)).square().mean().backward()
    opt.step()
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]) != ("moe_gen" in name)


def test_build_optimizer_without_trainable_params_fails() -> None:
    model = Toy()
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model, lr=1e-3, weight_decay=0.0)


# ---------------------------------------------------------------- gradient clipping


def test_clip_grad_norm_matches_torch_and_returns_float() -> None:
    torch.manual_seed(0)
    model, reference = Toy(), Toy()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(16, 4)
    for m in (model, reference):
        (m(x) * 100).square().mean().backward()
    norm = clip_grad_norm(model, max_norm=1.0)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    assert isinstance(norm, float) and norm == pytest.approx(float(expected), rel=1e-6) and norm > 1.0
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert float(clipped) == pytest.approx(1.0, rel=1e-4)


def test_clip_grad_norm_zeroes_non_finite_grads() -> None:
    model = Toy()
    model(torch.randn(4, 4)).sum().backward()
    model.llm2action.weight.grad[0, 0] = float("nan")
    model.llm2action.bias.grad[1] = float("inf")
    finite = torch.linalg.vector_norm(
        torch.cat([p.grad.flatten().nan_to_num(0.0, 0.0, 0.0) for p in model.parameters()])
    )
    norm = clip_grad_norm(model, max_norm=1e9)
    assert norm == pytest.approx(float(finite), rel=1e-5)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.llm2action.weight.grad[0, 0] == 0.0


def test_clip_grad_norm_without_grads_is_zero() -> None:
    assert clip_grad_norm(Toy(), 1.0) == 0.0


# ---------------------------------------------------------------- FSDP2, 2 gloo ranks


def _fsdp_optim_rank(rank: int, world_size: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = Toy()
    reference = Toy()
    reference.load_state_dict(model.state_dict())
    mesh = init_device_mesh("cpu", (world_size,))
    # activation-checkpoint wrapper + per-layer fully_shard, then the root (like parallelize()).
    for i, layer in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(layer)
        fully_shard(model.layers[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert all(isinstance(p, DTensor) for p in model.parameters())

    keys = ["moe_gen", "llm2action"]
    sharded_counts = select_trainable(model, keys)
    reference_counts = select_trainable(reference, keys)
    assert sharded_counts == reference_counts  # global element counts, not per-shard
    assert _names(model, True) == _names(reference, True)
    mults = {"layers.1.moe_gen": 2.0, "llm2action": 5.0}
    sharded_groups = _group_of(build_param_groups(model, 1e-3, 0.05, mults), model)
    assert sharded_groups == _group_of(build_param_groups(reference, 1e-3, 0.05, mults), reference)

    opt = build_optimizer(model, lr=1e-2, weight_decay=0.05, lr_multipliers=mults)
    torch.manual_seed(1)
    x = torch.randn(world_size, 8, 4)  # the global batch; each rank takes its slice
    (model(x[rank]) * 50).square().mean().backward()
    (reference(x.flatten(0, 1)) * 50).square().mean().backward()  # same mean loss over the global batch

    norm = clip_grad_norm(model, max_norm=0.5)
    ref_norm = float(
        torch.nn.utils.clip_grad_norm_([p for p in reference.parameters() if p.requires_grad], 0.5)
    )
    gathered = [None] * world_size
    dist.all_gather_object(gathered, norm)
    assert isinstance(norm, float) and gathered == [norm] * world_size  # identical on every rank
    assert norm == pytest.approx(ref_norm, rel=1e-5) and norm > 0.5
    ref_grads = {clean_param_name(n): p.grad for n, p in reference.named_parameters() if p.requires_grad}
    for name, param in model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.grad.full_tensor(), ref_grads[clean_param_name(name)])
        else:
            assert param.grad is None
    before = {clean_param_name(n): p.full_tensor() for n, p in model.named_parameters()}
    opt.step()
    changed = {
        clean_param_name(n)
        for n, p in model.named_parameters()
        if not torch.equal(p.full_tensor(), before[clean_param_name(n)])
    }
    assert changed == _names(reference, True)
    Path(out_dir, f"ok_{rank}").write_text(str(norm))


def test_fsdp2_selection_groups_and_clipping_on_two_ranks(tmp_path: Path) -> None:
    run_on_ranks(tmp_path, _fsdp_optim_rank, str(tmp_path))
    norms = {Path(tmp_path, f"ok_{r}").read_text() for r in range(2)}
    assert len(norms) == 1
