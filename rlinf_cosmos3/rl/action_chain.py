"""The real model's hybrid ODE/SDE denoising chain for a batch of observations, and its log-prob recomputed.

Rollout (:func:`sample_action_chain`) and training (:func:`chain_log_prob`) compute the velocity with ONE
function, :func:`packed_velocity`, which is the policy's packed training forward
(:meth:`~rlinf_cosmos3.models.cosmos3.policy.Cosmos3Policy.packed_velocity`: its memoised segments and packed
sequence, document-masked attention, one transformer call per pack, timesteps ``1000 * t`` as in training). So the ratio on unchanged weights is 1 by construction, not by two code paths agreeing. The
diffusers pipeline is not hooked: its UniPC scheduler is a multistep predictor-corrector whose corrector
would rewrite a stochastic sample with past velocities, so a step of it is not one Gaussian of the current
state; and it runs one observation at a time.

The chain: the scheduler's own grid (``set_timesteps`` on a copy: the same flow shift as eval), every step an
Euler ODE step for the video latents and the action tokens, except each decision's one SDE step
(:func:`~rlinf_cosmos3.rl.flow_sde.pick_sde_steps`) where its action tokens draw from the flow-SDE Gaussian.
The first latent frame is the observation's (the condition, held fixed); padded action channels are zeroed
after every step, as the pipeline does. What a decision keeps is the state at its SDE step (video latents
AND action tokens: the velocity depends on both), ``t``, ``t_next`` and the drawn action tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlinf_cosmos3.rl.flow_sde import (
    action_log_prob_mask,
    gaussian_log_prob,
    hybrid_step,
    ode_step,
    pick_sde_steps,
    sde_step_mean_std,
)

__all__ = ["ActionChain", "Generators", "cat_chains", "chain_log_prob", "denoising_grid", "packed_velocity",
           "prompt_token_ids", "sample_action_chain", "select_rows"]


@dataclass
class ActionChain:
    """What a batch of decisions keeps for training: enough to recompute each one's log-prob exactly."""

    input_ids: list[list[int]]
    """Each decision's prompt token ids (policy caption, as the processor tokenizes it)."""
    sde_step: torch.Tensor
    """``[B]`` long: the grid index of each decision's stochastic step."""
    t: torch.Tensor
    """``[B]`` float64: the time at the SDE step."""
    t_next: torch.Tensor
    xt_vision: torch.Tensor
    """``[B, C, T, h, w]``: the video latents at the SDE step (frame 0 the condition)."""
    xt_action: torch.Tensor
    """``[B, H, D]``: the action tokens at the SDE step."""
    x_next_action: torch.Tensor
    """``[B, H, D]``: the action tokens the SDE step drew (padded channels zeroed)."""
    mask: torch.Tensor
    """``[B, H, D]`` bool: the entries the log-prob counts (:func:`~rlinf_cosmos3.rl.flow_sde.action_log_prob_mask`)."""
    noise_level: float
    t_cap: float
    old_log_prob: torch.Tensor
    """``[B]``: the log-prob of the SDE step under the rollout's weights."""
    actions: torch.Tensor
    """``[B, H, raw_action_dim]``: the normalised action chunks at the chain's end (what the env gets)."""
    features: torch.Tensor | None = None
    """``[B, hidden]`` float32, when asked for (PPO): the pooled condition-frame feature of the forward at each
    decision's SDE step (:mod:`~rlinf_cosmos3.models.cosmos3.pooled_features`), what the value head reads."""


_ROW_FIELDS = ("sde_step", "t", "t_next", "xt_vision", "xt_action", "x_next_action", "mask", "old_log_prob",
               "actions")
"""The ``[B, ...]`` tensor fields of :class:`ActionChain` (``input_ids`` is the list alongside them)."""


def cat_chains(chains: Sequence[ActionChain]) -> ActionChain:
    """Decisions of several sampling calls as one batch (a round's decisions, then split into minibatches with
    :func:`select_rows`); they must share the noise level and the grid's ``t_cap``."""
    if not chains:
        raise ValueError("no chains to concatenate")
    first = chains[0]
    for chain in chains[1:]:
        if (chain.noise_level, chain.t_cap) != (first.noise_level, first.t_cap):
            raise ValueError(f"chains of noise level / t_cap {(chain.noise_level, chain.t_cap)} and "
                             f"{(first.noise_level, first.t_cap)} cannot form one batch")
    tensors = {name: torch.cat([getattr(c, name) for c in chains]) for name in _ROW_FIELDS}
    with_features = [c.features is not None for c in chains]
    if any(with_features) and not all(with_features):
        raise ValueError("chains with and without pooled features cannot form one batch")
    features = torch.cat([c.features for c in chains]) if all(with_features) else None
    return ActionChain(input_ids=[ids for c in chains for ids in c.input_ids], noise_level=first.noise_level,
                       t_cap=first.t_cap, features=features, **tensors)


def select_rows(chain: ActionChain, rows: Sequence[int] | torch.Tensor) -> ActionChain:
    """The decisions ``rows`` of a chain (a minibatch), in that order."""
    index = torch.as_tensor(rows, dtype=torch.long)
    tensors = {name: getattr(chain, name).index_select(0, index.to(getattr(chain, name).device))
               for name in _ROW_FIELDS}
    features = None if chain.features is None else chain.features.index_select(0, index.to(chain.features.device))
    return ActionChain(input_ids=[chain.input_ids[int(i)] for i in index], noise_level=chain.noise_level,
                       t_cap=chain.t_cap, features=features, **tensors)


def denoising_grid(policy: Any, num_steps: int) -> list[float]:
    """``num_steps + 1`` times from ~1 to 0: the policy scheduler's grid (its flow shift), on a copy so the
    pipeline's own scheduler keeps its state."""
    scheduler = copy.deepcopy(policy.pipeline.scheduler)
    scheduler.set_timesteps(int(num_steps))
    return [float(s) for s in scheduler.sigmas.double()]


def packed_velocity(policy: Any, input_ids: Sequence[Sequence[int]], xt_vision: torch.Tensor,
                    xt_action: torch.Tensor, t: torch.Tensor, *, pooled: bool = False) -> tuple[torch.Tensor, ...]:
    """Velocities (``[B, C, T, h, w]``, ``[B, H, D]`` float32) of a batch of states at per-sample times ``t``
    (``[B]``), through the policy's packed training forward (:meth:`Cosmos3Policy.packed_velocity`), masked as the
    pipeline masks them: the condition frame does not move, the padded action channels stay zero.
    Differentiable in the transformer's weights. ``pooled``: also the ``[B, hidden]`` pooled feature of the same
    calls (the value head's input)."""
    sigma = torch.as_tensor(t, dtype=torch.float64).to(torch.float32)
    out = policy.packed_velocity(input_ids, xt_vision, xt_action, sigma, pooled=True) if pooled else \
        policy.packed_velocity(input_ids, xt_vision, xt_action, sigma)
    velocity_v, velocity_a = out[0].clone(), out[1]
    velocity_v[:, :, 0] = 0  # the condition frame does not move (the pipeline masks its velocity too)
    raw = policy.domain.raw_action_dim
    velocity_a = torch.cat([velocity_a[..., :raw], torch.zeros_like(velocity_a[..., raw:])], dim=-1)
    return (velocity_v, velocity_a, out[2]) if pooled else (velocity_v, velocity_a)


Generators = torch.Generator | Sequence[torch.Generator]
"""One generator for the whole batch, or one per decision (row ``i`` draws only from generator ``i``, so a
decision's draws do not depend on which batch it was sampled in)."""


def _randn(shape: Sequence[int], generator: Generators, device: torch.device) -> torch.Tensor:
    """Standard normal ``[B, ...]`` on ``device``, drawn on the generator's device (see :data:`Generators`)."""
    if isinstance(generator, torch.Generator):
        return torch.randn(tuple(shape), generator=generator, device=generator.device).to(device)
    return torch.stack([torch.randn(tuple(shape[1:]), generator=g, device=g.device).to(device) for g in generator])


def _pick(batch: int, num_steps: int, generator: Generators, candidates: torch.Tensor | None) -> torch.Tensor:
    if isinstance(generator, torch.Generator):
        return pick_sde_steps(batch, num_steps, generator, candidates)
    return torch.cat([pick_sde_steps(1, num_steps, g, candidates) for g in generator])


def prompt_token_ids(policy: Any, prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
    """Token ids per decision: a string is the task, tokenized as the ``diffusers`` policy caption
    (``policy.processor.prompt_ids``); a sequence of ints is taken as already tokenized (any caption style)."""
    return [policy.processor.prompt_ids(p)[0] if isinstance(p, str) else [int(i) for i in p] for p in prompts]


@torch.no_grad()
def sample_action_chain(
    policy: Any,
    latents: torch.Tensor,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    *,
    num_steps: int,
    noise_level: float,
    executed_steps: int | torch.Tensor,
    generator: Generators,
    sde_candidates: torch.Tensor | None = None,
    features: bool = False,
) -> ActionChain:
    """Denoise a batch of observations (``latents`` ``[B, C, T, h, w]`` float32 whose frame 0 is each observation's
    condition latent, as ``policy.processor.encode_canvases`` gives it for the canvas held over the clip)
    with one flow-SDE step per decision; everything drawn from ``generator`` (SDE steps, initial noise, the
    SDE noise; one per batch or one per decision), so a seeded rollout repeats. ``prompts``: task strings or
    token ids (:func:`prompt_token_ids`). ``executed_steps``: how many chunk steps the env runs (the mask).
    ``noise_level`` 0 is the deterministic Euler ODE (eval): there is no density, ``old_log_prob`` is NaN.
    ``features``: keep each decision's pooled feature of the forward at its SDE step (``chain.features``)."""
    batch, channels, frames, height, width = latents.shape
    horizon, action_dim, raw = policy.cfg.action_horizon, policy.transformer.config.action_dim, \
        policy.domain.raw_action_dim
    if len(prompts) != batch:
        raise ValueError(f"{len(prompts)} prompts for {batch} observations")
    if not isinstance(generator, torch.Generator) and len(generator) != batch:
        raise ValueError(f"{len(generator)} generators for {batch} observations")
    input_ids = prompt_token_ids(policy, prompts)
    grid = denoising_grid(policy, num_steps)
    t_cap = grid[1]
    chosen = _pick(batch, num_steps, generator, sde_candidates)
    device = latents.device
    condition = latents[:, :, :1].float()
    noise_v = _randn(latents.shape, generator, device)
    x_v = torch.cat([condition, noise_v[:, :, 1:]], dim=2)
    x_a = _randn((batch, horizon, action_dim), generator, device)
    x_a[..., raw:] = 0
    mask = action_log_prob_mask(batch, horizon, action_dim, raw, executed_steps, device=x_a.device)
    keep_v, keep_a, keep_next = torch.zeros_like(x_v), torch.zeros_like(x_a), torch.zeros_like(x_a)
    keep_features: torch.Tensor | None = None
    old_log_prob = torch.full((batch,), 0.0 if noise_level else float("nan"), dtype=torch.float32, device=device)
    for i in range(num_steps):
        t, t_next = grid[i], grid[i + 1]
        rows = (chosen == i).to(x_a.device)
        times = torch.full((batch,), t, dtype=torch.float64)
        if features and bool(rows.any()):
            v_v, v_a, pooled = packed_velocity(policy, input_ids, x_v, x_a, times, pooled=True)
            if keep_features is None:
                keep_features = torch.zeros(batch, pooled.shape[-1], dtype=torch.float32, device=device)
            keep_features[rows.to(device)] = pooled.to(device)[rows.to(device)]
        else:
            v_v, v_a = packed_velocity(policy, input_ids, x_v, x_a, times)
        noise = _randn(x_a.shape, generator, device)
        step = hybrid_step(x_a, v_a, t, t_next, rows, noise_level, generator=None, t_cap=t_cap, noise=noise)
        x_next = step.x_next.clone()
        x_next[..., raw:] = 0
        if bool(rows.any()):
            keep_v[rows], keep_a[rows], keep_next[rows] = x_v[rows], x_a[rows], x_next[rows]
            if noise_level:
                log_prob = gaussian_log_prob(x_next, step.mean, step.std, mask)
                old_log_prob = torch.where(rows, log_prob.float(), old_log_prob)
        x_v = ode_step(x_v, v_v, t, t_next)
        x_v[:, :, :1] = condition
        x_a = x_next
    grid_t = torch.tensor(grid, dtype=torch.float64)
    return ActionChain(input_ids=input_ids, sde_step=chosen, t=grid_t[chosen], t_next=grid_t[chosen + 1],
                       xt_vision=keep_v, xt_action=keep_a, x_next_action=keep_next, mask=mask,
                       noise_level=float(noise_level), t_cap=t_cap, old_log_prob=old_log_prob,
                       actions=x_a[..., :raw].clone(), features=keep_features)


def chain_log_prob(policy: Any, chain: ActionChain, *, features: bool = False
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``[B]`` log-probs of the chain's SDE steps under the policy's current weights (differentiable): the same
    velocity forward as the rollout at the stored states, the same Gaussian, the same mask. ``features``: also
    the ``[B, hidden]`` pooled features of that forward (PPO's value input: no transformer pass of its own)."""
    out = packed_velocity(policy, chain.input_ids, chain.xt_vision, chain.xt_action, chain.t, pooled=features)
    v_a = out[1]
    x_t = chain.xt_action.to(v_a.device)
    mean, std = sde_step_mean_std(x_t, v_a, chain.t, chain.t_next, chain.noise_level, t_cap=chain.t_cap)
    log_prob = gaussian_log_prob(chain.x_next_action.to(v_a.device), mean, std, chain.mask.to(v_a.device))
    return (log_prob, out[2]) if features else log_prob
