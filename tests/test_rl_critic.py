"""PPO's critic on the real tiny Cosmos3 (CPU, float32): the pooled feature the value head reads (the condition
frame's final generation states, from the same forward as the velocity and the log-prob), and the critic itself
(its own initial weights, its text state in the checkpoint, a value loss that trains the head only)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, PolicyConfig
from rlinf_cosmos3.models.cosmos3.pooled_features import capture_generation_states
from rlinf_cosmos3.rl.action_chain import (
    cat_chains,
    chain_log_prob,
    packed_velocity,
    sample_action_chain,
    select_rows,
)
from rlinf_cosmos3.rl.critic import Critic
from rlinf_cosmos3.rl.value_head import clipped_value_loss

PROMPTS = ["put the mug on the plate", "push the plate", "put the mug on the plate"]


@pytest.fixture(scope="module")
def policy(tiny_model_and_stats) -> Cosmos3Policy:
    return Cosmos3Policy.from_pretrained(Path(tiny_model_and_stats.model), PolicyConfig())


def _state(policy: Cosmos3Policy, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn((batch, 48, 5, policy.cfg.canvas_height // 16, policy.cfg.canvas_width // 16), generator=g)
    actions = torch.randn((batch, 16, policy.transformer.config.action_dim), generator=g)
    return latents, actions


def _ids(policy: Cosmos3Policy, prompts: list[str]) -> list[list[int]]:
    return [policy.processor.prompt_ids(p)[0] for p in prompts]


def _alone(policy: Cosmos3Policy):
    """The policy with one transformer call per sample (diffusers' own attention, no packing)."""
    return dataclasses.replace(policy.cfg, max_tokens_per_pack=None)


def test_the_feature_is_the_condition_frames_mean_packed_or_alone(policy: Cosmos3Policy) -> None:
    """Sample by sample, the feature is the mean of the first h*w generation states (frame 0's patches: vision
    follows the text, patchified time-major); packed with others it is the same within float error."""
    latents, actions = _state(policy, 3)
    ids, t = _ids(policy, PROMPTS), torch.tensor([0.9, 0.5, 0.2])
    with torch.no_grad():
        _, _, packed = packed_velocity(policy, ids, latents, actions, t, pooled=True)
        saved, policy.cfg = policy.cfg, _alone(policy)
        try:
            _, _, alone = packed_velocity(policy, ids, latents, actions, t, pooled=True)
            patch = policy.transformer.config.latent_patch_size
            per_frame = (latents.shape[3] // patch) * (latents.shape[4] // patch)
            for row in range(3):
                with capture_generation_states(policy.transformer) as states:
                    packed_velocity(policy, ids[row:row + 1], latents[row:row + 1], actions[row:row + 1], t[row:row + 1])
                (gen,) = states
                torch.testing.assert_close(alone[row], gen[:per_frame].float().mean(dim=0), rtol=0, atol=0)
        finally:
            policy.cfg = saved
    assert packed.shape == (3, policy.transformer.config.hidden_size)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-5)


def test_the_feature_sees_the_observation_and_the_instruction(policy: Cosmos3Policy) -> None:
    """Same noise and time: another condition frame changes the feature, another instruction too; the same inputs
    packed twice give the same feature (each sample attends only to itself)."""
    latents, actions = _state(policy, 1)
    other_obs = latents.clone()
    other_obs[:, :, 0] += 0.5
    batch_v = torch.cat([latents, other_obs, latents, latents])
    batch_a = actions.expand(4, -1, -1).clone()
    ids = _ids(policy, [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[0]])
    with torch.no_grad():
        _, _, f = packed_velocity(policy, ids, batch_v, batch_a, torch.full((4,), 0.6), pooled=True)
    assert float((f[0] - f[1]).abs().max()) > 1e-3, "the feature ignores the observation"
    assert float((f[0] - f[2]).abs().max()) > 1e-3, "the feature ignores the instruction"
    torch.testing.assert_close(f[0], f[3], rtol=0, atol=1e-5)


def test_the_chain_keeps_its_sde_steps_feature_and_the_update_recomputes_it(policy: Cosmos3Policy) -> None:
    latents, _ = _state(policy, 3)
    chain = sample_action_chain(policy, latents, PROMPTS, num_steps=3, noise_level=0.5, executed_steps=8,
                                generator=[torch.Generator().manual_seed(i) for i in range(3)], features=True)
    assert chain.features is not None and chain.features.shape == (3, policy.transformer.config.hidden_size)
    with torch.no_grad():
        log_prob, features = chain_log_prob(policy, chain, features=True)
        _, _, at_step = packed_velocity(policy, chain.input_ids, chain.xt_vision, chain.xt_action, chain.t, pooled=True)
    torch.testing.assert_close(features, chain.features, rtol=0, atol=1e-5)  # the rollout's, on the same weights
    torch.testing.assert_close(at_step, chain.features, rtol=0, atol=1e-5)  # read at each decision's SDE step
    torch.testing.assert_close(log_prob, chain.old_log_prob, rtol=0, atol=1e-4)
    rows = select_rows(cat_chains([chain, chain]), [4, 0])
    torch.testing.assert_close(rows.features, chain.features[[1, 0]], rtol=0, atol=0)
    plain = sample_action_chain(policy, latents, PROMPTS, num_steps=3, noise_level=0.5, executed_steps=8,
                                generator=torch.Generator().manual_seed(0))
    assert plain.features is None
    with pytest.raises(ValueError, match="with and without pooled features"):
        cat_chains([chain, plain])


def test_the_value_loss_trains_the_head_only(policy: Cosmos3Policy) -> None:
    latents, _ = _state(policy, 2)
    chain = sample_action_chain(policy, latents, PROMPTS[:2], num_steps=2, noise_level=0.5, executed_steps=8,
                                generator=torch.Generator().manual_seed(3), features=True)
    critic = Critic(policy.transformer.config.hidden_size, [16, 8], lr=1e-3, weight_decay=0.0, clip_grad=1.0,
                    device="cpu", seed=5)
    policy.transformer.zero_grad(set_to_none=True)
    _, features = chain_log_prob(policy, chain, features=True)
    assert features.requires_grad  # the transformer's graph is there; the head cuts it
    values = critic.values(features)
    loss = clipped_value_loss(values, values.detach(), torch.tensor([1.0, 0.0])).loss
    loss.backward()
    assert all(p.grad is None for p in policy.transformer.parameters())
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in critic.head.parameters())


def test_the_critics_start_is_its_own_and_its_state_round_trips_exactly() -> None:
    torch.manual_seed(0)
    a = Critic(12, [8, 4], lr=1e-3, weight_decay=0.01, clip_grad=1.0, device="cpu", seed=7)
    torch.manual_seed(123)  # the global RNG does not decide the head's start, and is left as it was
    before = torch.get_rng_state()
    b = Critic(12, [8, 4], lr=1e-3, weight_decay=0.01, clip_grad=1.0, device="cpu", seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(x, y) for x, y in zip(a.head.state_dict().values(), b.head.state_dict().values(),
                                                 strict=True))
    features = torch.randn(5, 12, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        a.zero_grad()
        (a.values(features) - 1.0).pow(2).mean().backward()
        norm = a.step()
        assert float(norm) > 0
    c = Critic(12, [8, 4], lr=1e-3, weight_decay=0.01, clip_grad=1.0, device="cpu", seed=99)
    c.load_text(a.to_text())
    assert torch.equal(c.values(features), a.values(features))
    state_a, state_c = a.optimizer.state_dict(), c.optimizer.state_dict()
    assert state_a["param_groups"] == state_c["param_groups"]
    for key, entry in state_a["state"].items():
        assert all(torch.equal(entry[name], state_c["state"][key][name]) for name in entry)
    with pytest.raises(ValueError):
        c.load_text("not base64!")
