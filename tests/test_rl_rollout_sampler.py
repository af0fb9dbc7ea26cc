"""The collocated rollout sampler on the real tiny Cosmos3 (CPU, float32): env observations in, the eval
adapter's 7-D commands out, with a record whose old log-prob the training forward reproduces; seeded, and
the same per decision whether the envs come in one packed batch or one by one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf_cosmos3.actions import ActionNormalizer, EnvActionDecoder
from rlinf_cosmos3.config.rollout import RolloutModelConfig
from rlinf_cosmos3.models.cosmos3.packing import split_into_packs
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, PolicyConfig
from rlinf_cosmos3.rl.action_chain import cat_chains, chain_log_prob, select_rows
from rlinf_cosmos3.rl.rollout_sampler import RolloutDecisions, RolloutSampler, SamplerSettings, decision_seed
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter

TASKS = ["pick up the black bowl", "put the mug on the plate", "pick up the black bowl"]
SETTINGS = SamplerSettings(num_steps=3, noise_level=0.5, executed_steps=8, flow_shift=5.0)
SEEDS = [decision_seed(7, 0, env, 0) for env in range(len(TASKS))]


def observations(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n = len(TASKS)
    return {"main_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8),
            "task_descriptions": list(TASKS)}


def rows(obs: dict[str, Any], index: slice) -> tuple[Any, Any, list[str]]:
    return obs["main_images"][index], obs["wrist_images"][index], obs["task_descriptions"][index]


@pytest.fixture(scope="module")
def policy(tiny_model_and_stats) -> Cosmos3Policy:
    return Cosmos3Policy.from_pretrained(Path(tiny_model_and_stats.model), PolicyConfig())


@pytest.fixture(scope="module")
def decoder(tiny_model_and_stats) -> EnvActionDecoder:
    return EnvActionDecoder(ActionNormalizer(tiny_model_and_stats.stats, "quantile_rot"))


@pytest.fixture(scope="module")
def sampler(policy: Cosmos3Policy, decoder: EnvActionDecoder) -> RolloutSampler:
    return RolloutSampler(policy, decoder, SETTINGS, seed=3)


@pytest.fixture(scope="module")
def decisions(sampler: RolloutSampler) -> RolloutDecisions:
    return sampler.sample(*rows(observations(), slice(None)), seeds=SEEDS)


def test_shapes_and_dtypes(decisions: RolloutDecisions) -> None:
    n = len(TASKS)
    assert len(decisions) == n and decisions.seeds == SEEDS and not decisions.deterministic
    assert decisions.env_actions.shape == (n, 16, 7) and decisions.env_actions.dtype == np.float32
    assert set(np.unique(decisions.env_actions[..., 6])) <= {-1.0, 1.0}
    chain = decisions.chain
    assert len(chain.input_ids) == n and chain.input_ids == decisions.observations.input_ids
    assert chain.input_ids[0] == chain.input_ids[2] != chain.input_ids[1]
    assert chain.sde_step.dtype == torch.long and chain.sde_step.shape == (n,)
    assert chain.t.dtype == chain.t_next.dtype == torch.float64 and bool((chain.t > chain.t_next).all())
    assert chain.xt_vision.shape == (n, 48, 5, 12, 20) and chain.xt_vision.dtype == torch.float32
    assert chain.xt_action.shape == chain.x_next_action.shape == (n, 16, 64)
    assert chain.mask.dtype == torch.bool and chain.mask.shape == (n, 16, 64)
    assert chain.mask.sum(dim=(1, 2)).tolist() == [8 * 10] * n
    assert chain.old_log_prob.dtype == torch.float32 and bool(torch.isfinite(chain.old_log_prob).all())
    assert chain.actions.shape == (n, 16, 10) and chain.actions.dtype == torch.float32
    # the condition the chain kept is the observation's
    assert torch.equal(chain.xt_vision[:, :, 0], decisions.observations.latents[:, :, 0])


def test_seeded_rollout_repeats(policy: Cosmos3Policy, decoder: EnvActionDecoder,
                                decisions: RolloutDecisions) -> None:
    obs = rows(observations(), slice(None))
    again = RolloutSampler(policy, decoder, SETTINGS).sample(*obs, seeds=SEEDS)
    np.testing.assert_array_equal(again.env_actions, decisions.env_actions)
    assert torch.equal(again.chain.old_log_prob, decisions.chain.old_log_prob)
    assert torch.equal(again.chain.x_next_action, decisions.chain.x_next_action)
    # without explicit seeds, the sampler's own seeded generator draws them: two samplers of one seed agree
    first, second = (RolloutSampler(policy, decoder, SETTINGS, seed=5).sample(*obs) for _ in range(2))
    assert first.seeds == second.seeds and np.array_equal(first.env_actions, second.env_actions)
    other = RolloutSampler(policy, decoder, SETTINGS, seed=6).sample(*obs)
    assert other.seeds != first.seeds and not np.allclose(other.chain.actions, first.chain.actions)


def test_old_log_prob_is_the_training_forwards(policy: Cosmos3Policy, decisions: RolloutDecisions) -> None:
    """Ratio 1 on unchanged weights, also for a round's decisions concatenated and split into minibatches."""
    with torch.no_grad():
        ratio = torch.exp(chain_log_prob(policy, decisions.chain) - decisions.chain.old_log_prob)
        torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-5)
        round_ = cat_chains([decisions.chain, decisions.chain])
        minibatch = select_rows(round_, [4, 0, 2])
        assert minibatch.input_ids == [decisions.chain.input_ids[i] for i in (1, 0, 2)]
        torch.testing.assert_close(chain_log_prob(policy, minibatch), decisions.chain.old_log_prob[[1, 0, 2]],
                                   rtol=0, atol=1e-5)


def test_env_actions_are_the_eval_adapters_decoding(tiny_model_and_stats, decisions: RolloutDecisions) -> None:
    cfg = RolloutModelConfig(model_path=str(tiny_model_and_stats.model), action_stats_path=str(tiny_model_and_stats.stats),
                             action_normalization="quantile_rot")
    adapter = Cosmos3ActionAdapter(cfg, batching_max_size=8)
    np.testing.assert_array_equal(decisions.env_actions, adapter.model_to_env_actions(decisions.chain.actions.numpy()))


def test_batch_of_n_is_n_batches_of_one(policy: Cosmos3Policy, sampler: RolloutSampler,
                                        decisions: RolloutDecisions) -> None:
    """The batch ran as one packed transformer call per denoising step; each decision equals the one sampled
    alone with its seed (the per-sample forward), up to float rounding."""
    lengths = [len(ids) + 5 * 6 * 10 + 16 for ids in decisions.chain.input_ids]
    assert len(split_into_packs(lengths, policy.cfg.max_tokens_per_pack)) == 1
    calls: list[int] = []
    handle = policy.transformer.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        obs = observations()
        alone = [sampler.sample(*rows(obs, slice(i, i + 1)), seeds=SEEDS[i:i + 1]) for i in range(len(TASKS))]
        assert len(calls) == SETTINGS.num_steps * len(TASKS)
        calls.clear()
        sampler.sample(*rows(obs, slice(None)), seeds=SEEDS)
        assert len(calls) == SETTINGS.num_steps  # the whole batch in one call per step
    finally:
        handle.remove()
    chain = decisions.chain
    for i, one in enumerate(alone):
        assert one.chain.sde_step.tolist() == chain.sde_step[i:i + 1].tolist()
        assert one.chain.input_ids == chain.input_ids[i:i + 1]
        torch.testing.assert_close(one.chain.actions, chain.actions[i:i + 1], rtol=0, atol=1e-5)  # ~1e-6 seen
        torch.testing.assert_close(one.chain.old_log_prob, chain.old_log_prob[i:i + 1], rtol=0, atol=1e-4)
        np.testing.assert_allclose(one.env_actions, decisions.env_actions[i:i + 1], rtol=0, atol=1e-4)


def test_deterministic_mode_is_the_ode(policy: Cosmos3Policy, decoder: EnvActionDecoder,
                                       decisions: RolloutDecisions) -> None:
    """No stochastic step: where the SDE step would be drawn does not matter, and there is no density."""
    obs = rows(observations(), slice(None))
    ode = [RolloutSampler(policy, decoder, dataclasses.replace(SETTINGS, sde_candidates=(step,))).sample(
        *obs, seeds=SEEDS, deterministic=True) for step in (0, 2)]
    assert ode[0].deterministic and bool(torch.isnan(ode[0].chain.old_log_prob).all())
    assert torch.equal(ode[0].chain.actions, ode[1].chain.actions)
    np.testing.assert_array_equal(ode[0].env_actions, ode[1].env_actions)
    assert not torch.allclose(ode[0].chain.actions, decisions.chain.actions)


def test_bad_inputs(policy: Cosmos3Policy, decoder: EnvActionDecoder, sampler: RolloutSampler) -> None:
    obs = observations()
    with pytest.raises(ValueError, match="2 seeds for 3 observations"):
        sampler.sample(*rows(obs, slice(None)), seeds=SEEDS[:2])
    with pytest.raises(ValueError, match="observation batch sizes differ"):
        sampler.sample(obs["main_images"], obs["wrist_images"][:2], TASKS)
    with pytest.raises(ValueError, match="exceeds the policy's action horizon"):
        RolloutSampler(policy, decoder, dataclasses.replace(SETTINGS, executed_steps=17))
    with pytest.raises(ValueError, match="noise_level"):
        SamplerSettings(noise_level=-0.1)
    assert decision_seed(7, 0, 1, 0) != decision_seed(7, 0, 0, 1) and decision_seed(1, 2) == decision_seed(1, 2)
