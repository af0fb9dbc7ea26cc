"""PPO-clip with dual clip (rlinf_cosmos3.rl.ppo_loss) against hand-computed decisions.

Six decisions, ratio r and advantage A, clip 0.2, dual clip 3 (loss per decision = max(-A r, -A clip(r)),
capped at 3|A| for A < 0):

    r    A    -A r   -A clip(r)   max    dual cap   loss   gradient d/d log_prob (= -A r where unclipped)
    1.0  +1   -1.0   -1.0         -1.0   -          -1.0   -1.0
    1.5  +1   -1.5   -1.2         -1.2   -          -1.2    0   (clipped)
    0.5  +1   -0.5   -0.8         -0.5   -          -0.5   -0.5
    5.0  -1    5.0    1.2          5.0   3          3.0     0   (dual clipped)
    0.5  -1    0.5    0.8          0.8   3          0.8     0   (clipped)
    2.0  -2    4.0    2.4          4.0   6          4.0     4.0
"""

from __future__ import annotations

import math

import pytest
import torch

from rlinf_cosmos3.rl.ppo_loss import masked_mean, ppo_clip_loss

RATIOS = [1.0, 1.5, 0.5, 5.0, 0.5, 2.0]
ADVANTAGES = [1.0, 1.0, 1.0, -1.0, -1.0, -2.0]
LOSSES = [-1.0, -1.2, -0.5, 3.0, 0.8, 4.0]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.tensor([-3.0, 1.0, 0.5, -7.0, 2.0, 0.0], dtype=torch.float64)
    log_prob = (old + torch.tensor([math.log(r) for r in RATIOS], dtype=torch.float64)).requires_grad_(True)
    return log_prob, old, torch.tensor(ADVANTAGES, dtype=torch.float64)


def test_loss_gradient_and_metrics_hand_computed() -> None:
    log_prob, old, adv = _inputs()
    out = ppo_clip_loss(log_prob, old, adv)
    assert out.loss.item() == pytest.approx(sum(LOSSES) / 6)  # 5.1 / 6
    out.loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([-1.0, 0, -0.5, 0, 0, 4.0], dtype=torch.float64) / 6)
    m = out.metrics
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 and not v.requires_grad for v in m.values())
    assert m["clip_fraction"].item() == pytest.approx(2 / 6)
    assert m["dual_clip_fraction"].item() == pytest.approx(1 / 6)
    assert m["ratio_mean"].item() == pytest.approx(10.5 / 6)
    assert m["ratio_max"].item() == pytest.approx(5.0)
    # k3 = mean((r - 1) - ln r), each term >= 0
    k3 = sum((r - 1) - math.log(r) for r in RATIOS) / 6
    assert m["approx_kl"].item() == pytest.approx(k3)  # 0.52971
    assert m["num_decisions"].item() == 6 and m["kl_ref"].item() == 0


def test_mask_excludes_decisions_from_loss_and_metrics() -> None:
    log_prob, old, adv = _inputs()
    mask = torch.tensor([True, True, True, True, True, False])
    out = ppo_clip_loss(log_prob, old, adv, mask)
    assert out.loss.item() == pytest.approx(sum(LOSSES[:5]) / 5)  # 1.1 / 5
    out.loss.backward()
    assert log_prob.grad[5] == 0
    assert out.metrics["ratio_mean"].item() == pytest.approx(8.5 / 5)
    assert out.metrics["num_decisions"].item() == 5
    # nothing counted: a zero loss (no NaN), still differentiable
    empty = ppo_clip_loss(log_prob, old, adv, torch.zeros(6, dtype=torch.bool))
    assert empty.loss.item() == 0 and empty.metrics["ratio_max"].item() == 0


def test_without_dual_clip_the_negative_advantage_term_is_unbounded() -> None:
    log_prob, old, adv = _inputs()
    out = ppo_clip_loss(log_prob, old, adv, dual_clip=None)
    assert out.loss.item() == pytest.approx((sum(LOSSES) - 3.0 + 5.0) / 6)
    assert out.metrics["dual_clip_fraction"].item() == 0


def test_unchanged_weights_give_ratio_one_and_zero_kl() -> None:
    old = torch.tensor([-2.0, 5.0, 0.3])
    out = ppo_clip_loss(old.clone().requires_grad_(True), old, torch.tensor([1.0, -1.0, 0.5]))
    assert out.loss.item() == pytest.approx(-(1.0 - 1.0 + 0.5) / 3)
    assert out.metrics["approx_kl"].item() == 0 and out.metrics["clip_fraction"].item() == 0
    assert out.metrics["ratio_mean"].item() == 1


def test_kl_to_reference_term() -> None:
    log_prob, old, adv = _inputs()
    d = torch.tensor([0.5, -0.5, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # ref - log_prob
    ref = log_prob.detach() + d
    base = ppo_clip_loss(log_prob, old, adv).loss.item()
    out = ppo_clip_loss(log_prob, old, adv, ref_log_prob=ref, kl_coef=0.1)
    kl = sum(math.exp(x) - x - 1 for x in d.tolist()) / 6
    assert out.metrics["kl_ref"].item() == pytest.approx(kl)
    assert out.loss.item() == pytest.approx(base + 0.1 * kl)
    out.loss.backward()
    # d/d lp of 0.1 * mean(exp(ref - lp) - (ref - lp) - 1) = 0.1 * (1 - exp(d)) / 6: pulls lp toward ref
    kl_grad = 0.1 * (1 - d.exp()) / 6
    torch.testing.assert_close(log_prob.grad, torch.tensor([-1.0, 0, -0.5, 0, 0, 4.0], dtype=torch.float64) / 6
                               + kl_grad)


def test_an_exploded_ratio_gives_a_finite_loss_and_gradient() -> None:
    old = torch.zeros(2)
    log_prob = torch.tensor([300.0, -300.0], requires_grad=True)  # exp(300) overflows float32
    out = ppo_clip_loss(log_prob, old, torch.tensor([-1.0, 1.0]))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(log_prob.grad).all()
    assert out.loss.item() == pytest.approx((3.0 + 0.0) / 2, abs=1e-6)  # dual cap 3, r ~ 0 -> -A r ~ 0


def test_bad_settings_are_refused() -> None:
    log_prob, old, adv = _inputs()
    with pytest.raises(ValueError, match="clip_ratio"):
        ppo_clip_loss(log_prob, old, adv, clip_ratio=1.5)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(log_prob, old, adv, dual_clip=0.9)
    with pytest.raises(ValueError, match="ref_log_prob"):
        ppo_clip_loss(log_prob, old, adv, kl_coef=0.1)


def test_masked_mean() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 10.0])
    assert masked_mean(x, torch.tensor([True, True, True, False])).item() == 2.0
    assert masked_mean(x, None).item() == 4.0
