"""The hybrid ODE/SDE chain on the real tiny diffusers Cosmos3 (CPU, float32): the log-prob recomputed from the
stored chain states through the policy's packed forward equals the rollout's on unchanged weights, packed and
per sample alike, and moves (with a gradient) when the weights move."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, PolicyConfig
from rlinf_cosmos3.rl.action_chain import ActionChain, chain_log_prob, denoising_grid, sample_action_chain

PROMPTS = ["put the mug on the plate", "push the plate", "put the mug on the plate"]
NUM_STEPS, EXECUTED = 3, 8


@pytest.fixture(scope="module")
def policy(tiny_model_and_stats) -> Cosmos3Policy:
    return Cosmos3Policy.from_pretrained(Path(tiny_model_and_stats.model), PolicyConfig())


def _latents(policy: Cosmos3Policy) -> torch.Tensor:
    """Condition latents of the policy's latent shape (only frame 0 is read)."""
    shape = (len(PROMPTS), 48, 5, policy.cfg.canvas_height // 16, policy.cfg.canvas_width // 16)
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 0.5


@pytest.fixture(scope="module")
def chain(policy: Cosmos3Policy) -> ActionChain:
    return sample_action_chain(policy, _latents(policy), PROMPTS, num_steps=NUM_STEPS, noise_level=0.5,
                               executed_steps=EXECUTED, generator=torch.Generator().manual_seed(1),
                               sde_candidates=torch.tensor([0, 2]))


def test_chain_records_each_decisions_sde_step(policy: Cosmos3Policy, chain: ActionChain) -> None:
    grid = denoising_grid(policy, NUM_STEPS)
    assert len(grid) == NUM_STEPS + 1 and grid[-1] == 0.0 and grid[0] < 1.0
    assert set(chain.sde_step.tolist()) <= {0, 2}
    for row, step in enumerate(chain.sde_step.tolist()):
        assert chain.t[row].item() == grid[step] and chain.t_next[row].item() == grid[step + 1]
    assert chain.actions.shape == (len(PROMPTS), 16, 10)
    assert int(chain.mask[0].sum()) == EXECUTED * 10
    assert float(chain.x_next_action[..., 10:].abs().max()) == 0.0
    assert torch.isfinite(chain.old_log_prob).all()
    # condition frames are kept from the observation
    torch.testing.assert_close(chain.xt_vision[:, :, 0], _latents(policy)[:, :, 0], rtol=0, atol=0)


def test_seeded_rollout_repeats(policy: Cosmos3Policy, chain: ActionChain) -> None:
    again = sample_action_chain(policy, _latents(policy), PROMPTS, num_steps=NUM_STEPS, noise_level=0.5,
                                executed_steps=EXECUTED, generator=torch.Generator().manual_seed(1),
                                sde_candidates=torch.tensor([0, 2]))
    assert torch.equal(again.actions, chain.actions) and torch.equal(again.old_log_prob, chain.old_log_prob)


def test_ratio_is_one_on_unchanged_weights_packed_and_per_sample(policy: Cosmos3Policy, chain: ActionChain) -> None:
    with torch.no_grad():
        packed = chain_log_prob(policy, chain)
        per_sample_cfg = dataclasses.replace(policy.cfg, max_tokens_per_pack=None)
        packed_cfg, policy.cfg = policy.cfg, per_sample_cfg
        try:
            alone = chain_log_prob(policy, chain)
        finally:
            policy.cfg = packed_cfg
    ratio = torch.exp(packed - chain.old_log_prob)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.exp(alone - chain.old_log_prob), torch.ones_like(ratio), rtol=0, atol=1e-5)


def test_log_prob_follows_the_weights(policy: Cosmos3Policy, chain: ActionChain) -> None:
    """A gradient reaches the transformer, and a step along it raises the log-prob (the ratio leaves 1)."""
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    policy.transformer.zero_grad(set_to_none=True)
    try:
        chain_log_prob(policy, chain).sum().backward()
        grads = [p.grad for p in params if p.grad is not None]
        assert grads and sum(float(g.abs().sum()) for g in grads) > 0
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=1e-4)
            moved = chain_log_prob(policy, chain)
        assert float((moved - chain.old_log_prob).sum()) > 1e-3
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
        policy.transformer.zero_grad(set_to_none=True)
