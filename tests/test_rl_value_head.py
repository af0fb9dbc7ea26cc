"""The value head and its clipped value loss (rlinf_cosmos3.rl.value_head) against hand-computed values.

Clipped value loss, clip 0.2, Huber delta 10 (= squared error / 2 here):

    V    V_old  R    V_clip            huber(R - V)   huber(R - V_clip)   max     d/dV
    0.5  0.2    1.0  0.2 + 0.2 = 0.4   0.125          0.18                0.18    0 (the clipped branch, clamped)
    0.0  0.1    0.0  0.1 - 0.1 = 0.0   0              0                   0       0
    1.0  1.0    0.0  1.0               0.5            0.5                 0.5     -(R - V) = 1
    mean 0.68 / 3 = 0.226667, gradient [0, 0, 1/3], clip fraction 1/3 (|V - V_old| > 0.2 only in the first row)
"""

from __future__ import annotations

import pytest
import torch

from rlinf_cosmos3.rl.value_head import ValueHead, clipped_value_loss, huber, masked_mean_pool


def test_clipped_value_loss_hand_computed() -> None:
    values = torch.tensor([0.5, 0.0, 1.0], requires_grad=True)
    out = clipped_value_loss(values, torch.tensor([0.2, 0.1, 1.0]), torch.tensor([1.0, 0.0, 0.0]))
    assert out.loss.item() == pytest.approx(0.68 / 3)
    out.loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([0.0, 0.0, 1 / 3]))
    assert out.metrics["value_clip_fraction"].item() == pytest.approx(1 / 3)
    assert not any(v.requires_grad for v in out.metrics.values())
    # masked: only the first row counts
    masked = clipped_value_loss(values, torch.tensor([0.2, 0.1, 1.0]), torch.tensor([1.0, 0.0, 0.0]),
                                torch.tensor([True, False, False]))
    assert masked.loss.item() == pytest.approx(0.18)


def test_explained_variance() -> None:
    returns = torch.tensor([0.0, 1.0, 0.0, 1.0])
    perfect = clipped_value_loss(returns.clone(), returns, returns)
    assert perfect.metrics["explained_variance"].item() == pytest.approx(1.0)
    # constant prediction 0.5: the residual varies as much as the returns -> 0
    flat = clipped_value_loss(torch.full((4,), 0.5), torch.full((4,), 0.5), returns)
    assert flat.metrics["explained_variance"].item() == pytest.approx(0.0)
    assert torch.isnan(clipped_value_loss(returns, returns, torch.ones(4)).metrics["explained_variance"])


def test_huber() -> None:
    torch.testing.assert_close(huber(torch.tensor([0.5, -2.0, 3.0]), 1.0), torch.tensor([0.125, 1.5, 2.5]))


def test_value_head_shape_small_start_and_detached_input() -> None:
    torch.manual_seed(0)
    head = ValueHead(16, (32, 8))
    features = torch.randn(5, 16, requires_grad=True)
    values = head(features)
    assert values.shape == (5,)
    assert values.abs().max().item() < 0.5  # last layer std 0.02, bias 0: starts near 0
    values.sum().backward()
    assert features.grad is None  # detached: the value loss trains the head only
    assert all(p.grad is not None for p in head.parameters())
    attached = ValueHead(16, (32, 8), detach_input=False)
    attached(features).sum().backward()
    assert features.grad is not None and features.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        ValueHead(0)


def test_masked_mean_pool() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    torch.testing.assert_close(masked_mean_pool(hidden, torch.tensor([[True, True, False]])),
                               torch.tensor([[2.0, 3.0]]))
    torch.testing.assert_close(masked_mean_pool(hidden), torch.tensor([[104 / 3, 106 / 3]]))
