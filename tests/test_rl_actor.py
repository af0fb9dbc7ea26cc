"""The RL actor rank in-process on the real tiny Cosmos3 (CPU, fp32): its sampler, its PPO-clip update and its
checkpoints, with the advantages given (a random tiny model never succeeds in LIBERO, so the simulator alone would
give GRPO no signal). The observations are random images; everything else is the library's own code.

* the update moves exactly the configured trainable part (``actor.trainable``) and AdamW holds state for it only;
* 2 iterations straight equal 1 iteration + a checkpoint + a fresh rank resumed from it + 1 iteration, bit for bit
  (weights and optimizer state; PPO: the value head and its AdamW state too);
* the first minibatch of an update sees ratio 1 (the weights the rollout sampled with);
* PPO end to end on the rank: the values the sampler returns -> GAE over a hand-made pair of episodes (one success,
  one cut at the cap) -> the update's clipped value loss, whose first minibatch is the Huber error of those values
  against the returns; the value head is saved beside the model, not in the weights the converter reads;
* the KL term (``algorithm.kl_coef > 0``): the reference log-probs are those of a rank freshly loaded from the
  model directory, the swap leaves the trained weights bit for bit, and a resumed rank keeps the same reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_cosmos3.checkpoint import is_complete_checkpoint
from rlinf_cosmos3.components.optim import named_parameters_clean
from rlinf_cosmos3.config.rl import GENERATION_TOWER_KEYS, register_hydra_schema
from rlinf_cosmos3.rl.action_chain import cat_chains, chain_log_prob
from rlinf_cosmos3.rl.rollout_sampler import decision_seed
from rlinf_cosmos3.rl.rounds import ppo_decisions
from rlinf_cosmos3.validation.rl import VALUE_HEAD_FILE
from rlinf_cosmos3.workers.actor.fsdp_rl_worker import FSDPRLWorker

REPO = Path(__file__).resolve().parent.parent
TASKS = ["pick up the black bowl", "put the mug on the plate", "pick up the black bowl", "put the mug on the plate"]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5]
EPISODES = [[0, 2], [1, 3]]
"""PPO: env 0 of each sampling call plays episode A (decisions 0, 2: success at the second), env 1 episode B (1, 3:
cut at the cap)."""
SUCCESSES = [True, False]


def rl_config(model: Path, stats: Path, *overrides: str) -> dict[str, Any]:
    """The tiny recipe as the launcher composes it, on the given model (a resolved plain dict, as the driver hands
    it to the actor)."""
    register_hydra_schema()
    with initialize_config_dir(config_dir=str(REPO / "examples/rl/config"), version_base=None):
        cfg = compose("libero_rl_cosmos3_tiny", overrides=[f"rollout.model.model_path={model}",
                                                           f"rollout.model.action_stats_path={stats}", *overrides])
    raw = OmegaConf.to_container(cfg, resolve=True)
    raw.pop("hydra", None)
    return raw


def make_worker(tiny_model_and_stats, *overrides: str, resume_dir: Path | None = None) -> FSDPRLWorker:
    worker = FSDPRLWorker(rl_config(tiny_model_and_stats.model, tiny_model_and_stats.stats,
                                    "algorithm.minibatch_size=3", *overrides))
    worker.setup(str(resume_dir) if resume_dir else None)
    return worker


def sample_round(worker: FSDPRLWorker, index: int) -> dict[int, float]:
    """Two sampling calls on random observations (2 envs each, as two env stages would); PPO: the values returned
    per decision id."""
    rng = np.random.default_rng(index)
    ids: list[int] = []
    values: dict[int, float] = {}
    for call in range(2):
        images = rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8)
        seeds = [decision_seed(42, index, 2 * call + env, 1, 0) for env in range(2)]
        reply = worker.sample(images, images[::-1].copy(), TASKS[2 * call:2 * call + 2], seeds)
        assert reply["actions"].shape == (2, 16, 7) and np.isfinite(reply["actions"]).all()
        assert ("values" in reply) == (worker.critic is not None)
        ids += reply["ids"]
        values.update(zip(reply["ids"], reply.get("values", []), strict=False))
    assert ids == [0, 1, 2, 3]
    return values


def iteration(worker: FSDPRLWorker, index: int) -> dict[str, float]:
    """One iteration: a round of four decisions, then the update on all of them: GRPO with fixed advantages, PPO
    with GAE over :data:`EPISODES` from the values the sampler returned."""
    values = sample_round(worker, index)
    if worker.critic is None:
        return worker.update([0, 1, 2, 3], ADVANTAGES, index)
    round_ = ppo_decisions(SUCCESSES, EPISODES, [[values[d] for d in ids] for ids in EPISODES], 0.99, 0.95)
    return worker.update(round_.decision_ids, round_.advantages, index, round_.returns)


@pytest.mark.parametrize("trainable", ["generation", "all"])
def test_the_update_moves_only_the_trainable_part(tiny_model_and_stats, trainable: str) -> None:
    worker = make_worker(tiny_model_and_stats, f"actor.trainable={trainable}")
    transformer = worker.policy.transformer
    params = named_parameters_clean(transformer)
    before = {name: p.detach().clone() for name, p in params}
    trainable_names = {name for name, p in params if p.requires_grad}
    if trainable == "generation":
        assert trainable_names == {n for n, _ in params if any(k in n for k in GENERATION_TOWER_KEYS)}
        assert len(trainable_names) < len(params)  # the understanding tower is frozen
    else:
        assert len(trainable_names) == len(params)
    metrics = iteration(worker, 1)
    assert metrics["optimizer_steps"] == 4  # 2 epochs x ceil(4 / 3) minibatches
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    changed = {name for name, p in params if not torch.equal(before[name], p.detach())}
    assert changed <= trainable_names, f"frozen parameters changed: {sorted(changed - trainable_names)[:5]}"
    assert len(changed) >= 0.9 * len(trainable_names), "most trainable tensors should move"
    # AdamW keeps state for the trainable parameters only
    with_state = {id(p) for p in worker.optimizer.state}
    assert {name for name, p in params if id(p) in with_state} <= trainable_names
    assert all(p.grad is None for _, p in params)  # the update leaves no gradient behind


def test_the_first_minibatch_sees_ratio_one(tiny_model_and_stats) -> None:
    """One epoch of one minibatch: the log-probs are recomputed on the weights that sampled (ratio 1, no clip)."""
    worker = make_worker(tiny_model_and_stats, "algorithm.update_epochs=1", "algorithm.minibatch_size=4")
    metrics = iteration(worker, 1)
    assert metrics["optimizer_steps"] == 1
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["clip_fraction"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert np.isfinite(metrics["rollout_log_prob_mean"])


def test_no_decisions_no_step(tiny_model_and_stats) -> None:
    """A round whose groups are all uniform: no optimizer step, the sampled decisions are forgotten."""
    worker = make_worker(tiny_model_and_stats)
    images = np.zeros((2, 256, 256, 3), dtype=np.uint8)
    worker.sample(images, images, TASKS[:2], [1, 2])
    before = {k: v.clone() for k, v in worker.policy.transformer.state_dict().items()}
    metrics = worker.update([], [], 1)
    assert metrics["optimizer_steps"] == 0 and worker.iteration == 1
    assert all(torch.equal(before[k], v) for k, v in worker.policy.transformer.state_dict().items())
    assert worker.sample(images, images, TASKS[:2], [1, 2])["ids"] == [0, 1]  # a new round starts at id 0


def _assert_equal_states(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal_states(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal_states(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "grpo_kl"])
def test_resume_is_bit_identical(tiny_model_and_stats, tmp_path: Path, algorithm: str) -> None:
    """2 iterations straight == 1 iteration, checkpoint, a fresh rank resumed from it, 1 iteration: weights and
    AdamW state bit for bit (CPU; PPO: the value head and its AdamW state too; with the KL term: the same reference,
    the model directory's weights, not the checkpoint's), and the second iteration's metrics."""
    options = {"grpo": ["algorithm.name=grpo"], "ppo": ["algorithm.name=ppo"],
               "grpo_kl": ["algorithm.name=grpo", "algorithm.kl_coef=0.05"]}[algorithm]
    straight = make_worker(tiny_model_and_stats, f"runner.log_path={tmp_path}", *options)
    first = iteration(straight, 1)
    step = Path(straight.save_checkpoint(str(tmp_path / "global_step_1"), counters={"episodes": 4.0}))
    assert is_complete_checkpoint(step)
    second = iteration(straight, 2)
    assert first["optimizer_steps"] == second["optimizer_steps"] == 4

    resumed = make_worker(tiny_model_and_stats, f"runner.log_path={tmp_path}", *options, resume_dir=step)
    assert resumed.iteration == 1 and resumed.counters["episodes"] == 4.0
    again = iteration(resumed, 2)
    again.pop("update_s"), second.pop("update_s")
    assert again == second
    _assert_equal_states(straight.full_state(), resumed.full_state())
    assert straight.full_state()["optimizer"]["state"], "the optimizer holds state after the updates"
    assert ("critic" in straight.full_state()) == (algorithm == "ppo")
    if algorithm == "ppo":
        assert straight.full_state()["critic"]["optimizer"]["state"], "the critic's AdamW holds state"
        assert again["value_loss"] > 0
    if algorithm == "grpo_kl":
        assert again["kl_ref"] > 0  # iteration 2 samples with trained weights: away from the reference


def test_ppo_values_gae_and_the_value_loss_on_the_rank(tiny_model_and_stats, tmp_path: Path) -> None:
    """One epoch of one minibatch: the value head's first loss is the Huber (delta 10: half the squared error) of
    the sampler's values against their GAE returns; the head and the trainable part both move; the value head is
    in the checkpoint beside the model, and the consolidated weights (what the converter reads) are exactly the
    transformer's."""
    from rlinf_cosmos3.checkpoint import load_full_weights

    worker = make_worker(tiny_model_and_stats, "algorithm.name=ppo", "algorithm.update_epochs=1",
                         "algorithm.minibatch_size=4", f"runner.log_path={tmp_path}")
    head_before = {k: v.clone() for k, v in worker.critic.head.state_dict().items()}
    weights_before = {n: p.detach().clone() for n, p in named_parameters_clean(worker.policy.transformer)
                      if p.requires_grad}
    values = sample_round(worker, 1)
    assert sorted(values) == [0, 1, 2, 3] and all(np.isfinite(v) and abs(v) < 1.0 for v in values.values())
    round_ = ppo_decisions(SUCCESSES, EPISODES, [[values[d] for d in ids] for ids in EPISODES], 0.99, 0.95)
    assert round_.returns[1] == pytest.approx(1.0)  # A's success decision: its reward, no bootstrap
    metrics = worker.update(round_.decision_ids, round_.advantages, 1, round_.returns)
    old = np.array([values[d] for d in round_.decision_ids])
    expected = 0.5 * np.mean((np.array(round_.returns) - old) ** 2)
    assert metrics["optimizer_steps"] == 1 and metrics["value_clip_fraction"] == 0.0
    assert metrics["value_loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["value_mean"] == pytest.approx(old.mean()) and np.isfinite(metrics["explained_variance"])
    assert any(not torch.equal(head_before[k], v) for k, v in worker.critic.head.state_dict().items())
    params = dict(named_parameters_clean(worker.policy.transformer))
    assert any(not torch.equal(weights_before[n], params[n].detach()) for n in weights_before)

    step = Path(worker.save_checkpoint(str(tmp_path / "global_step_1"), counters={"episodes": 2.0}))
    assert (step / VALUE_HEAD_FILE).is_file()
    weights = load_full_weights(step)
    assert weights.keys() == worker.policy.transformer.state_dict().keys()
    with pytest.raises(ValueError, match="returns are PPO's value targets"):
        worker.update([], [], 2)


def test_kl_reference_is_the_start_policy(tiny_model_and_stats) -> None:
    """With ``algorithm.kl_coef > 0``: after an update has moved the weights, the reference log-probs of a new
    round's decisions equal those of a rank freshly loaded from the model directory, computing them leaves the
    trained weights bit for bit, and the update logs a positive KL to the reference (0 on the first round)."""
    worker = make_worker(tiny_model_and_stats, "algorithm.kl_coef=0.1", "algorithm.update_epochs=1",
                         "algorithm.minibatch_size=4")
    first = iteration(worker, 1)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-5)  # the round was sampled with the start weights
    sample_round(worker, 2)
    chain = cat_chains(worker._chains)
    trained = {k: v.clone() for k, v in worker.policy.transformer.state_dict().items()}
    with torch.no_grad():
        reference = worker._reference_log_probs(chain)
        current = chain_log_prob(worker.policy, chain)
    assert all(torch.equal(trained[k], v) for k, v in worker.policy.transformer.state_dict().items())
    fresh = make_worker(tiny_model_and_stats)
    with torch.no_grad():
        expected = chain_log_prob(fresh.policy, chain)
    torch.testing.assert_close(reference, expected, rtol=0, atol=1e-5)
    assert float((reference - current).abs().max()) > 1e-3, "the update did not move the policy away"
    second = worker.update([0, 1, 2, 3], ADVANTAGES, 2)
    assert second["kl_ref"] > 0


def test_the_value_of_an_observation_no_decision_is_taken_on(tiny_model_and_stats) -> None:
    """PPO's bootstrap of a truncated episode: ``observation_values`` reads an observation as ``sample`` reads a
    decision's (the same seed, the same value, bit for bit on unchanged weights) and keeps nothing: the next
    decision ids go on where they were. GRPO has no value head to ask."""
    worker = make_worker(tiny_model_and_stats, "algorithm.name=ppo")
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8)
    seeds = [decision_seed(42, 1, env, 1, 3) for env in range(2)]
    decided = worker.sample(images, images[::-1].copy(), TASKS[:2], seeds)
    valued = worker.observation_values(images, images[::-1].copy(), TASKS[:2], seeds)
    assert valued["values"] == decided["values"] and valued["sample_s"] > 0
    other = worker.observation_values(images, images[::-1].copy(), TASKS[:2], [s + 1 for s in seeds])
    assert other["values"] != decided["values"]  # the value is read at the seeded chain's SDE step
    assert worker.sample(images, images, TASKS[:2], seeds)["ids"] == [2, 3]
    grpo = make_worker(tiny_model_and_stats, "algorithm.name=grpo")
    with pytest.raises(RuntimeError, match="needs the value head"):
        grpo.observation_values(images, images, TASKS[:2], seeds)
