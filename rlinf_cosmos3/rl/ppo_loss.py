"""PPO-clip policy loss on per-decision log-prob ratios, with dual clip and an optional KL term toward a
reference policy. GRPO and PPO share it; they differ only in where the advantages come from.

Why these pieces (RLinf's ``compute_ppo_actor_loss``, the defaults of its LIBERO recipes):

* ratio ``r = exp(log_prob - old_log_prob)``, one per decision (the log-prob of a decision is already the sum
  over its executed action entries, :func:`~rlinf_cosmos3.rl.action_chain.chain_log_prob`);
* clipped surrogate ``max(-A r, -A clip(r, 1 - eps, 1 + eps))`` with ``eps = 0.2``;
* dual clip (Ye et al. 2020): for ``A < 0`` the loss is also capped at ``-c A`` (``c = 3``), so one decision
  whose ratio exploded cannot dominate the minibatch with an unbounded negative-advantage term;
* the masked mean over decisions (dropped GRPO groups, padding);
* optionally ``kl_coef`` times the k3 estimate of KL(pi_theta || pi_ref) (GRPO's form,
  ``exp(ref - lp) - (ref - lp) - 1``, non-negative per sample), default off as in RLinf's recipes.

The log-ratio is clamped to ``[-max_log_ratio, max_log_ratio]`` before ``exp``: a decision's log-prob sums
~100 Gaussian entries, so after a few updates a ratio can overflow float32, and ``0 * inf`` in the backward of
the unselected branch would turn the gradient into NaN. Clamped entries are clipped anyway.

Metrics are detached 0-D tensors, never ``.item()``: the caller decides when to synchronise with the host.
``approx_kl`` is the k3 estimator of KL(pi_old || pi_theta) on the rollout's samples,
``mean((r - 1) - log r)`` (Schulman, "Approximating KL divergence"): unbiased and never negative, unlike k1
(``-mean(log r)``, what RLinf logs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["PolicyLoss", "masked_mean", "ppo_clip_loss"]

MAX_LOG_RATIO = 20.0
"""Bound on ``|log r|`` before ``exp`` (``e^20 ~ 5e8``, far past any clip, far from float32's overflow)."""


class PolicyLoss(NamedTuple):
    loss: torch.Tensor
    """0-D, differentiable: the masked mean of the clipped surrogate (+ ``kl_coef`` x KL to the reference)."""
    metrics: dict[str, torch.Tensor]
    """Detached 0-D tensors: ``policy_loss``, ``approx_kl`` (k3), ``clip_fraction``, ``dual_clip_fraction``,
    ``ratio_mean``, ``ratio_max``, ``kl_ref`` (0 without a reference), ``num_decisions``."""


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``values`` over ``mask``'s True entries (0 when none: an empty minibatch adds no gradient)."""
    if mask is None:
        return values.mean()
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    clip_ratio: float = 0.2,
    dual_clip: float | None = 3.0,
    ref_log_prob: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    max_log_ratio: float = MAX_LOG_RATIO,
) -> PolicyLoss:
    """The PPO-clip loss over decisions: ``log_prob`` (differentiable), ``old_log_prob`` (the rollout's),
    ``advantages`` and ``mask`` (bool, True = counts) all of one shape, usually ``[D]``.
    ``dual_clip``: None turns it off, else it must exceed 1. ``ref_log_prob``: the reference policy's
    log-probs of the same samples, used when ``kl_coef > 0``."""
    if not 0.0 < clip_ratio < 1.0:
        raise ValueError(f"clip_ratio must be in (0, 1), got {clip_ratio}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if kl_coef > 0 and ref_log_prob is None:
        raise ValueError("kl_coef > 0 needs ref_log_prob")
    advantages = advantages.detach().to(log_prob.dtype)
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-max_log_ratio, max_log_ratio)
    ratio = log_ratio.exp()
    surrogate = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    per_decision = torch.maximum(surrogate, clipped)
    clip_active = clipped > surrogate  # the clipped branch is taken: no gradient from this decision
    if dual_clip is not None:
        cap = -advantages * dual_clip  # = dual_clip * |A| where A < 0
        dual_active = (advantages < 0) & (per_decision > cap)
        per_decision = torch.where(dual_active, cap, per_decision)
    else:
        dual_active = torch.zeros_like(clip_active)
    policy_loss = masked_mean(per_decision, mask)
    loss = policy_loss
    kl_ref = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    if ref_log_prob is not None and kl_coef > 0:
        diff = (ref_log_prob.detach() - log_prob).clamp(-max_log_ratio, max_log_ratio)
        kl_ref = masked_mean(diff.exp() - diff - 1.0, mask)
        loss = loss + kl_coef * kl_ref
    with torch.no_grad():
        counted = torch.ones_like(clip_active) if mask is None else mask.bool()
        ratio_d, log_ratio_d = ratio.detach(), log_ratio.detach()
        metrics = {
            "policy_loss": policy_loss.detach(),
            "approx_kl": masked_mean((ratio_d - 1.0) - log_ratio_d, counted),
            "clip_fraction": masked_mean(clip_active.to(ratio_d.dtype), counted),
            "dual_clip_fraction": masked_mean(dual_active.to(ratio_d.dtype), counted),
            "ratio_mean": masked_mean(ratio_d, counted),
            "ratio_max": torch.where(counted, ratio_d, torch.zeros_like(ratio_d)).max(),
            "kl_ref": kl_ref.detach(),
            "num_decisions": counted.sum(),
        }
    return PolicyLoss(loss, metrics)
