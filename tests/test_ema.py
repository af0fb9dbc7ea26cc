"""PowerEMA: cosmos-framework's power-function EMA, on plain modules and on real FSDP2 shards."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_helpers import Toy, run_on_ranks
from torch import nn

from rlinf_cosmos3.components.ema import PowerEMA, power_ema_exponent
from rlinf_cosmos3.components.optim import select_trainable

# ---------------------------------------------------------------- helpers






def _train_steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


# ---------------------------------------------------------------- formula


def test_exponent_matches_edm2_relative_std() -> None:
    gamma = power_ema_exponent(0.1)
    assert gamma == pytest.approx(6.937203937, rel=1e-8)
    # EDM2 (Karras et al. 2024): sigma_rel = sqrt((g + 1) / ((g + 2)^2 (g + 3)))
    for rate in (0.05, 0.1, 0.2):
        g = power_ema_exponent(rate)
        assert math.sqrt((g + 1) / ((g + 2) ** 2 * (g + 3))) == pytest.approx(rate, rel=1e-9)


def test_beta_follows_cosmos_iteration_convention() -> None:
    ema = PowerEMA(Toy(), rate=0.1)
    gamma = power_ema_exponent(0.1)
    assert ema.beta(1) == 0.0  # first update: cosmos iteration 0 -> copy the weights
    assert ema.beta(2) == pytest.approx(0.5 ** (gamma + 1))
    assert ema.beta(1000) == pytest.approx((1 - 1 / 1000) ** (gamma + 1))
    shifted = PowerEMA(Toy(), rate=0.1, iteration_shift=5)
    assert shifted.beta(1) == pytest.approx((1 - 1 / 6) ** (gamma + 1))


# ---------------------------------------------------------------- plain modules


def test_update_matches_hand_computation() -> None:
    torch.manual_seed(0)
    model = Toy()
    select_trainable(model, ["layers", "llm2action"])
    ema = PowerEMA(model, rate=0.1)
    assert set(ema.shadow) == {n for n, p in model.named_parameters() if p.requires_grad}
    gamma = power_ema_exponent(0.1)
    expected = {n: p.detach().double().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for step in range(1, 6):
        _train_steps(model, opt, torch.randn(8, 4))
        ema.update(step)
        i = step - 1
        beta = 0.0 if i < 1 else (1 - 1 / (i + 1)) ** (gamma + 1)
        for name, param in model.named_parameters():
            if param.requires_grad:
                expected[name] = expected[name] * beta + param.detach().double() * (1 - beta)
    for name, value in expected.items():
        assert ema.shadow[name].dtype == torch.float32
        torch.testing.assert_close(ema.shadow[name].double(), value, rtol=1e-6, atol=1e-7)
        assert not torch.equal(ema.shadow[name], dict(model.named_parameters())[name].detach())
    with pytest.raises(ValueError, match=">= 1"):
        ema.update(0)


def test_bf16_params_get_an_fp32_shadow() -> None:
    model = Toy().to(torch.bfloat16)
    ema = PowerEMA(model, rate=0.1)
    assert all(t.dtype == torch.float32 for t in ema.shadow.values())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(1)  # beta 0: the shadow becomes the (bf16) weights exactly
    for name, param in model.named_parameters():
        assert torch.equal(ema.shadow[name], param.float())


def test_disabled_ema_holds_nothing() -> None:
    model = Toy()
    ema = PowerEMA(model, enabled=False)
    assert ema.shadow == {} and ema.state_dict() == {}
    ema.update(3)
    with pytest.raises(RuntimeError, match="disabled"):
        ema.full_state_dict()


def test_state_dict_round_trip_and_mismatch() -> None:
    torch.manual_seed(0)
    model = Toy()
    ema = PowerEMA(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        _train_steps(model, opt, torch.randn(8, 4))
        ema.update(step)
    other = PowerEMA(Toy())
    other.load_state_dict(ema.state_dict())
    for name in ema.shadow:
        assert torch.equal(other.shadow[name], ema.shadow[name])
    narrower = Toy()
    select_trainable(narrower, ["llm2action"])
    with pytest.raises(KeyError, match="unexpected"):
        PowerEMA(narrower).load_state_dict(ema.state_dict())


def test_full_state_dict_is_keyed_like_the_model() -> None:
    torch.manual_seed(0)
    model = Toy().to(torch.bfloat16)
    select_trainable(model, ["llm2action"])
    ema = PowerEMA(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for step in range(1, 4):
        _train_steps(model, opt, torch.randn(8, 4, dtype=torch.bfloat16))
        ema.update(step)
    full = ema.full_state_dict()
    reference = model.state_dict()
    assert list(full) == list(reference)  # same keys, same order, buffers included
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in full.values())
    for key, value in full.items():
        if key in ema.shadow:
            assert torch.equal(value, ema.shadow[key])
        else:
            assert torch.equal(value, reference[key].float())


# ---------------------------------------------------------------- FSDP2, 2 gloo ranks


def _fsdp_ema_rank(rank: int, world_size: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model, reference = Toy(), Toy()
    reference.load_state_dict(model.state_dict())
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in (model, reference):
        select_trainable(m, ["layers", "llm2action"])
    ema, ref_ema = PowerEMA(model, rate=0.1), PowerEMA(reference, rate=0.1)

    params = dict(model.named_parameters())
    for name, shadow in ema.shadow.items():
        assert isinstance(params[name], DTensor) and not isinstance(shadow, DTensor)
        assert shadow.shape == params[name].to_local().shape  # a local shard, not the full tensor
    local = sum(t.numel() for t in ema.shadow.values())
    counts = [None] * world_size
    dist.all_gather_object(counts, local)
    assert sum(counts) == sum(t.numel() for t in ref_ema.shadow.values())

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.2)
    ref_opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.2)
    torch.manual_seed(1)
    for step in range(1, 5):
        x = torch.randn(world_size, 8, 4)
        _train_steps(model, opt, x[rank])
        _train_steps(reference, ref_opt, x.flatten(0, 1))
        ema.update(step)
        ref_ema.update(step)

    full = ema.full_state_dict()
    if rank == 0:
        ref_full = ref_ema.full_state_dict()
        assert list(full) == list(reference.state_dict())
        for key, value in full.items():
            torch.testing.assert_close(value, ref_full[key], rtol=1e-5, atol=1e-6)
        # the EMA lags the weights: it is not simply the final parameters
        assert not torch.allclose(full["llm2action.weight"], reference.llm2action.weight.detach(), atol=1e-4)
        torch.save(full, Path(out_dir, "ema_full.pt"))
    else:
        assert full == {}


def test_fsdp2_sharded_shadow_and_consolidated_export(tmp_path: Path) -> None:
    run_on_ranks(tmp_path, _fsdp_ema_rank, str(tmp_path))
    full = torch.load(tmp_path / "ema_full.pt", weights_only=True)
    assert "scale" in full and full["llm2action.weight"].shape == (3, 5)
