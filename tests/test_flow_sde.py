"""The flow-SDE step (rlinf_cosmos3.rl.flow_sde): its density, its mask, its ODE limit, its marginals.

The checks are independent of the code under test: densities from ``scipy.stats.norm``, the ODE step from
diffusers' own ``FlowMatchEulerDiscreteScheduler``, the mean against RLinf's (x0_hat, eps_hat)-weighted form
written out here, and marginal preservation against a 1-D Gaussian data distribution whose velocity field is
known in closed form.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from rlinf_cosmos3.rl.flow_sde import (
    action_log_prob_mask,
    gaussian_log_prob,
    hybrid_step,
    ode_step,
    pick_sde_steps,
    sde_sigma,
    sde_step_mean_std,
)


def test_log_prob_matches_scipy_normal_density() -> None:
    g = torch.Generator().manual_seed(0)
    x, mean = torch.randn(3, 4, 5, generator=g, dtype=torch.float64), torch.randn(3, 4, 5, generator=g,
                                                                                 dtype=torch.float64)
    std = torch.rand(3, 4, 5, generator=g, dtype=torch.float64) + 0.1
    mask = torch.ones(3, 4, 5, dtype=torch.bool)
    expected = norm.logpdf(x.numpy(), loc=mean.numpy(), scale=std.numpy()).reshape(3, -1).sum(axis=1)
    np.testing.assert_allclose(gaussian_log_prob(x, mean, std, mask).numpy(), expected, rtol=1e-12)


def test_mask_leaves_out_padded_channels_and_unexecuted_steps() -> None:
    """Only the first ``executed`` steps and the ``raw`` real channels count; whatever the other entries hold
    (here huge deviations and a zero std, as on zeroed padding) changes nothing."""
    batch, horizon, dim, raw = 2, 16, 64, 10
    executed = torch.tensor([4, 16])
    mask = action_log_prob_mask(batch, horizon, dim, raw, executed)
    assert mask.shape == (batch, horizon, dim)
    assert int(mask[0].sum()) == 4 * raw and int(mask[1].sum()) == 16 * raw
    assert not mask[0, 4:].any() and not mask[:, :, raw:].any() and mask[0, :4, :raw].all()

    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, horizon, dim, generator=g, dtype=torch.float64)
    mean = torch.randn(batch, horizon, dim, generator=g, dtype=torch.float64)
    std = torch.full((batch, horizon, dim), 0.3, dtype=torch.float64)
    std[:, :, raw:] = 0.0
    outside = ~mask
    x_far = torch.where(outside, x + 1e3, x)
    got = gaussian_log_prob(x_far, mean, std, mask)
    assert torch.isfinite(got).all()
    for row, steps in enumerate(executed.tolist()):
        expected = norm.logpdf(x[row, :steps, :raw].numpy(), mean[row, :steps, :raw].numpy(), 0.3).sum()
        assert got[row].item() == pytest.approx(expected, rel=1e-12)


def test_zero_noise_mean_is_the_schedulers_euler_step() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    scheduler.set_timesteps(10)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 16, 64, generator=g)
    for i, timestep in enumerate(scheduler.timesteps):  # the scheduler's own walk over its grid
        v = torch.randn(1, 16, 64, generator=g)
        t, t_next = float(scheduler.sigmas[i]), float(scheduler.sigmas[i + 1])
        reference = scheduler.step(v, timestep, x, return_dict=False)[0]
        mean, std = sde_step_mean_std(x, v, t, t_next, 0.0)
        torch.testing.assert_close(mean, reference, rtol=0, atol=1e-6)
        torch.testing.assert_close(ode_step(x, v, t, t_next), reference, rtol=0, atol=1e-6)
        assert float(std.abs().max()) == 0.0
        x = reference


def test_mean_and_std_are_rlinfs_weighted_form() -> None:
    """mean = (1 - t + d) x0_hat + (t - d - s^2 d / 2t) eps_hat, std = s sqrt(d), s = a sqrt(t / (1 - t))."""
    g = torch.Generator().manual_seed(3)
    x, v = torch.randn(4, 16, 10, generator=g, dtype=torch.float64), torch.randn(4, 16, 10, generator=g,
                                                                                dtype=torch.float64)
    a, t, t_next = 0.5, 0.7, 0.55
    d, s = t - t_next, a * math.sqrt(t / (1 - t))
    x0_hat, eps_hat = x - t * v, x + (1 - t) * v
    expected = (1 - t + d) * x0_hat + (t - d - s * s * d / (2 * t)) * eps_hat
    mean, std = sde_step_mean_std(x, v, t, t_next, a)
    torch.testing.assert_close(mean, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(std, torch.full_like(x, s * math.sqrt(d)), rtol=1e-12, atol=0)

    # per-sample times ([B]) give each row its own step
    ts, tn = torch.tensor([0.9, 0.5, 0.3, 0.1]), torch.tensor([0.8, 0.4, 0.2, 0.0])
    mean_b, std_b = sde_step_mean_std(x, v, ts, tn, a)
    for row in range(4):
        m, sd = sde_step_mean_std(x[row:row + 1], v[row:row + 1], float(ts[row]), float(tn[row]), a)
        torch.testing.assert_close(mean_b[row:row + 1], m)
        torch.testing.assert_close(std_b[row:row + 1], sd)


def test_sigma_at_pure_noise_needs_the_cap() -> None:
    with pytest.raises(ValueError, match="t_cap"):
        sde_sigma(1.0, 0.5)
    assert float(sde_sigma(1.0, 0.5, t_cap=0.9)) == pytest.approx(0.5 * math.sqrt(1.0 / 0.1))
    assert float(sde_sigma(0.3, 0.5, t_cap=0.9)) == pytest.approx(0.5 * math.sqrt(0.3 / 0.7))
    with pytest.raises(ValueError, match="t_next < t"):
        sde_step_mean_std(torch.zeros(1, 2), torch.zeros(1, 2), 0.4, 0.5, 0.5)


def test_hybrid_step_keeps_ode_rows_deterministic_and_noise_per_row() -> None:
    g = torch.Generator().manual_seed(4)
    x, v = torch.randn(3, 16, 10, generator=g), torch.randn(3, 16, 10, generator=g)
    rows = torch.tensor([True, False, True])
    step = hybrid_step(x, v, 0.6, 0.5, rows, 0.5, torch.Generator().manual_seed(9))
    torch.testing.assert_close(step.x_next[1], ode_step(x, v, 0.6, 0.5)[1], rtol=0, atol=0)
    assert float(step.std[1].abs().max()) == 0.0
    assert not torch.allclose(step.x_next[0], step.mean[0])
    # a row's draw does not depend on which other rows are stochastic
    other = hybrid_step(x, v, 0.6, 0.5, torch.tensor([True, True, False]), 0.5, torch.Generator().manual_seed(9))
    torch.testing.assert_close(other.x_next[0], step.x_next[0], rtol=0, atol=0)


def test_pick_sde_steps_is_seeded_and_stays_in_candidates() -> None:
    a = pick_sde_steps(500, 10, torch.Generator().manual_seed(5), candidates=torch.tensor([1, 2, 3]))
    b = pick_sde_steps(500, 10, torch.Generator().manual_seed(5), candidates=torch.tensor([1, 2, 3]))
    assert torch.equal(a, b) and set(a.tolist()) == {1, 2, 3}
    assert set(pick_sde_steps(500, 4, torch.Generator().manual_seed(6)).tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="candidates"):
        pick_sde_steps(2, 4, None, candidates=torch.tensor([4]))


MU, S = 1.5, 0.5


def _gaussian_data_velocity(x: torch.Tensor, t: float) -> torch.Tensor:
    """Exact E[eps - x0 | x_t] for x0 ~ N(MU, S^2), eps ~ N(0, 1), x_t = t eps + (1 - t) x0."""
    var = (1 - t) ** 2 * S * S + t * t
    return (t - (1 - t) * S * S) / var * (x - (1 - t) * MU) - MU


def _chain(every_step_sde: bool, noise_level: float, *, drift_correction: bool = True, n: int = 50_000) -> torch.Tensor:
    """Samples from t = 1 to 0 on a 100-step grid, the one SDE step per sample drawn by pick_sde_steps (or every
    step stochastic); without ``drift_correction`` the SDE step is Euler plus the same noise (a wrong sampler)."""
    steps = 100
    grid = torch.linspace(1, 0, steps + 1, dtype=torch.float64).tolist()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)
    chosen = pick_sde_steps(n, steps, g)
    for i in range(steps):
        t, t_next = grid[i], grid[i + 1]
        v = _gaussian_data_velocity(x, t)
        rows = torch.ones(n, dtype=torch.bool) if every_step_sde else chosen == i
        step = hybrid_step(x, v, t, t_next, rows, noise_level, g, t_cap=grid[1])
        if not drift_correction:
            step.x_next = step.x_next - step.mean + ode_step(x, v, t, t_next)
        x = step.x_next
    return x


@pytest.mark.parametrize("every_step_sde", [False, True], ids=["hybrid-one-sde-step", "every-step-sde"])
def test_sde_chain_preserves_the_data_marginal(every_step_sde: bool) -> None:
    """Noise to data through the chain ends at N(MU, S^2): mean and std within 0.01 / 0.015 (50k samples: sampling
    error ~0.002, Euler's 100 steps ~0.003)."""
    x = _chain(every_step_sde, 0.5)
    assert float(x.mean()) == pytest.approx(MU, abs=0.01)
    assert float(x.std()) == pytest.approx(S, abs=0.015)


def test_marginal_check_catches_a_sampler_without_the_drift_correction() -> None:
    """The marginal test has power: adding the noise without the score term inflates the spread far beyond
    its tolerance."""
    x = _chain(True, 0.5, drift_correction=False, n=10_000)
    assert float(x.std()) > S + 0.1
