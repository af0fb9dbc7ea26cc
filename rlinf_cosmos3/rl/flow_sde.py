"""Flow-SDE: stochastic denoising steps with exact Gaussian log-probabilities, for RL of the action tokens.

Why: policy-gradient RL needs the probability of what the policy sampled, and the flow-matching sampler is a
deterministic ODE (no density). Following RLinf's ``flow_sde`` (piRL), chosen steps of the ACTION tokens'
chain become Gaussian transitions with a known mean and standard deviation; the rest stay on the ODE. The
video latents never leave the ODE path, so they add no probability mass.

Convention (diffusers' flow-match schedulers, ``x_t = t * eps + (1 - t) * x0``, velocity ``v = eps - x0``,
``t`` from 1 (noise) to 0 (data)). With ``x0_hat = x_t - t v`` and ``eps_hat = x_t + (1 - t) v`` the model's
predictions, the score of the marginal is ``-eps_hat / t``; the reverse-time SDE with diffusion ``sigma_t``
that keeps the ODE's marginals, discretised from ``t`` to ``t - delta`` (Euler-Maruyama), is

    mean = x_t - delta * v - sigma_t^2 * delta / (2 t) * eps_hat
         = (1 - t + delta) * x0_hat + (t - delta - sigma_t^2 * delta / (2 t)) * eps_hat     (RLinf's form)
    std  = sigma_t * sqrt(delta),      sigma_t = a * sqrt(t / (1 - t))

``a`` is the noise level (RLinf: ~0.5). With ``a = 0`` the mean is the Euler ODE step ``x_t + (t_next - t) v``.
``sigma_t`` diverges at ``t = 1``; RLinf evaluates the first step's denominator at the grid's second point.
:func:`sde_sigma` does the same with ``t_cap``: the denominator is ``1 - min(t, t_cap)``, and the samplers pass
the grid's second point (diffusers' shifted grids start at 1 - 1e-6, not at 1, so the cap is a bound, not an
equality test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "HybridStep",
    "action_log_prob_mask",
    "gaussian_log_prob",
    "hybrid_step",
    "ode_step",
    "pick_sde_steps",
    "sde_sigma",
    "sde_step_mean_std",
]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def sde_sigma(t: float | torch.Tensor, noise_level: float, t_cap: float | None = None) -> torch.Tensor:
    """Diffusion coefficient ``a * sqrt(t / (1 - min(t, t_cap)))``: the noise grows toward pure noise, where
    the data barely constrains the state, and vanishes at the data end (``t -> 0``)."""
    t = torch.as_tensor(t, dtype=torch.float64)
    if noise_level == 0:  # the ODE limit, defined at t = 1 too
        return torch.zeros_like(t)
    denom_t = t if t_cap is None else torch.clamp(t, max=float(t_cap))
    if bool((denom_t >= 1).any()):
        raise ValueError("sde_sigma needs t < 1 (or t_cap < 1): sigma_t diverges at pure noise; pass the grid's "
                         "second point as t_cap")
    return noise_level * torch.sqrt(t / (1 - denom_t))


def ode_step(x_t: torch.Tensor, velocity: torch.Tensor, t: float | torch.Tensor,
             t_next: float | torch.Tensor) -> torch.Tensor:
    """The Euler step ``x_t + (t_next - t) v``, as diffusers' ``FlowMatchEulerDiscreteScheduler.step`` takes it:
    the deterministic steps of the hybrid chain."""
    dt = torch.as_tensor(t_next, dtype=torch.float64) - torch.as_tensor(t, dtype=torch.float64)
    return x_t + _bcast(dt, x_t) * velocity


def sde_step_mean_std(
    x_t: torch.Tensor,
    velocity: torch.Tensor,
    t: float | torch.Tensor,
    t_next: float | torch.Tensor,
    noise_level: float,
    *,
    t_cap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the flow-SDE transition ``x_t -> x_{t_next}`` (module docstring); ``t``, ``t_next`` are
    scalars or ``[B]`` (one per sample). The mean is differentiable in ``velocity``: the policy's log-prob
    gradient flows through it. The std depends on the grid only, never on the weights."""
    t64 = torch.as_tensor(t, dtype=torch.float64)
    delta = t64 - torch.as_tensor(t_next, dtype=torch.float64)
    if bool((delta <= 0).any()) or bool((t64 <= 0).any()):
        raise ValueError("a denoising step needs 0 <= t_next < t")
    sigma = sde_sigma(t64, noise_level, t_cap)
    eps_hat = x_t + _bcast(1 - t64, x_t) * velocity
    mean = x_t - _bcast(delta, x_t) * velocity - _bcast(sigma**2 * delta / (2 * t64), x_t) * eps_hat
    std = _bcast(sigma * torch.sqrt(delta), x_t).expand_as(x_t)
    return mean, std


def gaussian_log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """``sum over masked entries of log N(x_next; mean, std^2)`` per sample (``[B]``; dims after the first
    summed). Entries outside ``mask`` (padded channels, unexecuted steps) are not evaluated at all, so a zero std
    there (a channel the pipeline zeroes) cannot turn the sum into NaN."""
    mask = mask.to(torch.bool).expand_as(x_next)
    safe_std = torch.where(mask, std, torch.ones_like(std))
    z = torch.where(mask, (x_next - mean) / safe_std, torch.zeros_like(x_next))
    per_entry = -0.5 * z**2 - torch.log(safe_std) - _LOG_SQRT_2PI
    return torch.where(mask, per_entry, torch.zeros_like(per_entry)).flatten(1).sum(dim=1)


def action_log_prob_mask(
    batch: int,
    horizon: int,
    action_dim: int,
    raw_action_dim: int,
    executed_steps: int | torch.Tensor,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``[B, horizon, action_dim]`` bool: which entries of the action tokens a decision's log-prob counts.

    Channels: the ``raw_action_dim`` real ones (LIBERO: dpos 3, rot6d 6, gripper 1); the padding up to the
    model's ``action_dim`` is zeroed by the sampler after every step, so it is not a random variable. The env's
    7-D command is a fixed function of the 10 channels (rot6d -> axis-angle), part of the environment: what the
    policy samples, and what its density is of, are the 10 model channels.
    Steps: the first ``executed_steps`` (per sample when a ``[B]`` tensor) of the chunk, the ones the env runs;
    the rest never reach the env, and counting their noise would only add variance to the ratio (RLinf slices
    its log-probs to the executed chunk and env channels alike). Pass ``executed_steps=horizon`` to count all.
    """
    steps = torch.arange(horizon, device=device).view(1, horizon, 1)
    executed = torch.as_tensor(executed_steps, device=device).reshape(-1, 1, 1)
    channels = torch.arange(action_dim, device=device).view(1, 1, action_dim)
    return ((steps < executed) & (channels < raw_action_dim)).expand(batch, horizon, action_dim)


def pick_sde_steps(batch: int, num_steps: int, generator: torch.Generator | None,
                   candidates: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` long: each decision's one stochastic step ("hybrid ODE/SDE"), uniform over ``candidates``
    (default: every step of the grid), drawn on the generator's device so a seeded rollout repeats."""
    pool = torch.arange(num_steps) if candidates is None else torch.as_tensor(candidates, dtype=torch.long).cpu()
    if pool.numel() == 0 or int(pool.min()) < 0 or int(pool.max()) >= num_steps:
        raise ValueError(f"SDE step candidates must lie in [0, {num_steps}), got {pool.tolist()}")
    device = generator.device if generator is not None else torch.device("cpu")
    draw = torch.randint(pool.numel(), (batch,), generator=generator, device=device).cpu()
    return pool[draw]


@dataclass
class HybridStep:
    """One step of a hybrid chain for a batch: the next state, and the Gaussian it came from (``std`` 0 on the
    rows that took the ODE step)."""

    x_next: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


def hybrid_step(
    x_t: torch.Tensor,
    velocity: torch.Tensor,
    t: float,
    t_next: float,
    sde_rows: torch.Tensor,
    noise_level: float,
    generator: torch.Generator | None,
    *,
    t_cap: float | None = None,
    noise: torch.Tensor | None = None,
) -> HybridStep:
    """Step a batch ``[B, ...]`` from ``t`` to ``t_next``: rows where ``sde_rows`` (``[B]`` bool) is set draw
    from the flow-SDE Gaussian, the others take the ODE (Euler) step. The noise is drawn for the whole batch
    (one draw per step whatever the rows), so which rows are stochastic never shifts another row's noise.
    ``noise``: that standard normal draw, made by the caller (per-row generators); None: drawn from ``generator``."""
    ode = ode_step(x_t, velocity, t, t_next)
    sde_mean, sde_std = sde_step_mean_std(x_t, velocity, t, t_next, noise_level, t_cap=t_cap)
    if noise is None:
        device = generator.device if generator is not None else x_t.device
        noise = torch.randn(x_t.shape, generator=generator, device=device, dtype=x_t.dtype)
    elif noise.shape != x_t.shape:
        raise ValueError(f"noise {tuple(noise.shape)} for a state {tuple(x_t.shape)}")
    noise = noise.to(x_t.device, x_t.dtype)
    rows = _bcast(sde_rows.to(x_t.device, torch.bool), x_t)
    mean = torch.where(rows, sde_mean, ode)
    std = torch.where(rows, sde_std, torch.zeros_like(sde_std))
    return HybridStep(x_next=mean + std * noise, mean=mean, std=std)


def _bcast(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A scalar or ``[B]`` value shaped to broadcast against ``like`` ``[B, ...]``, in ``like``'s dtype."""
    value = torch.as_tensor(value, device=like.device)
    if value.dtype != torch.bool:
        value = value.to(like.dtype)
    return value.reshape(value.shape + (1,) * (like.dim() - value.dim())) if value.dim() else value
