"""The RL actor rank: the policy that samples the rollouts (RLinf's "collocated" mode) and is trained on them.

One set of weights: :meth:`FSDPRLWorker.sample` serves the env workers' observations in batches with the
:class:`~rlinf_cosmos3.rl.rollout_sampler.RolloutSampler` (the packed forward over the whole batch at every
denoising step) and keeps each decision's :class:`~rlinf_cosmos3.rl.action_chain.ActionChain` row here, on the
rank's device; the driver gets the env commands and the decisions' ids only. :meth:`FSDPRLWorker.update` then
takes the ids the driver kept (GRPO's groups with signal) with their advantages and runs the PPO-clip epochs over
minibatches of them, the log-probs recomputed by :func:`~rlinf_cosmos3.rl.action_chain.chain_log_prob` on the
stored chain states. There is no weight sync and no server.

PPO (``algorithm.name=ppo``) adds the :class:`~rlinf_cosmos3.rl.critic.Critic`: :meth:`sample` also returns each
decision's value (the value head on the pooled feature of the forward at its SDE step) and keeps it as the value
loss's clip reference; the driver computes GAE from those values and hands the returns to :meth:`update`, whose
minibatches add the clipped value loss, computed from the pooled features of the same forward that recomputes the
log-probs. The critic's weights and AdamW state are saved in the checkpoint beside, not inside, the model.

The KL term (``algorithm.kl_coef > 0``) pulls toward the start policy: :class:`~rlinf_cosmos3.rl.reference.
ReferenceWeights` keeps the trainable part as loaded from ``rollout.model.model_path`` (before a resume overwrites it)
on the host; each update first swaps it in once for every kept decision's reference log-prob.

Model loading, FSDP2, AdamW and checkpoints are SFT's (:mod:`rlinf_cosmos3.components.sft_trainer`,
:mod:`rlinf_cosmos3.checkpoint`), fed the RL run as an SFT config (:func:`~rlinf_cosmos3.config.rl.sft_view`), so
an RL checkpoint has the SFT layout and converts with ``toolkits/cosmos3/convert_checkpoint.py`` the same way.

Randomness is keyed, not streamed: each decision's noise comes from the seed the driver hands in (of iteration,
env, attempt and decision), each epoch's minibatch order from ``(seed, iteration, epoch)``. A resumed run
therefore repeats the straight run exactly (the checkpoint also carries every RNG state, as SFT's does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlinf_cosmos3.actions import ActionNormalizer, EnvActionDecoder
from rlinf_cosmos3.checkpoint import load_checkpoint, save_checkpoint
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.cluster import Worker
from rlinf_cosmos3.components.optim import clip_grad_norm_
from rlinf_cosmos3.components.sft_trainer import build_sft_optimization, build_sft_policy
from rlinf_cosmos3.config.rl import RLConfig, sft_view
from rlinf_cosmos3.rl.action_chain import ActionChain, cat_chains, chain_log_prob, select_rows
from rlinf_cosmos3.rl.critic import Critic
from rlinf_cosmos3.rl.ppo_loss import ppo_clip_loss
from rlinf_cosmos3.rl.reference import ReferenceWeights
from rlinf_cosmos3.rl.rollout_sampler import RolloutSampler, SamplerSettings, decision_seed
from rlinf_cosmos3.rl.value_head import clipped_value_loss
from rlinf_cosmos3.validation.rl import RL_STATE_KEY, VALUE_HEAD_FILE, load_rl_config

__all__ = ["FSDPRLWorker", "MINIBATCH_STREAM"]

MINIBATCH_STREAM = 1
"""Key that separates the minibatch shuffles' seeds from the decisions' (:func:`decision_seed`)."""
CRITIC_STREAM = 2
"""Key of the value head's initial weights' seed."""
_MEAN_METRICS = ("policy_loss", "approx_kl", "clip_fraction", "dual_clip_fraction", "ratio_mean", "grad_norm")
_VALUE_METRICS = ("value_loss", "value_clip_fraction", "value_grad_norm")


class FSDPRLWorker(Worker):
    """A Ray actor rank; the driver calls :meth:`setup`, then per iteration :meth:`sample` (many times) and
    :meth:`update`, and :meth:`save_checkpoint`. Also usable in-process (one rank, no Ray) by tests."""

    def __init__(self, cfg: dict[str, Any] | RLConfig) -> None:
        # The driver validated the config; re-validating gives the rank the typed view and fails early if a path
        # is not visible from its node.
        self.cfg: RLConfig = cfg if isinstance(cfg, RLConfig) else load_rl_config(cfg, check_gpus=False)
        self.iteration = 0
        self.counters: dict[str, float] = {}
        self._chains: list[ActionChain] = []
        self._values: list[torch.Tensor] = []
        """PPO: each sampling call's rollout values (the value loss's clip reference), beside ``_chains``."""
        self._num_decisions = 0
        self.critic: Critic | None = None
        self.reference: ReferenceWeights | None = None

    def setup(self, resume_dir: str | None = None) -> dict[str, Any]:
        """Build the policy (SFT's loader and FSDP2 wrapping, ``actor.trainable`` selected), AdamW, the sampler;
        optionally resume. Returns a summary for the driver's log."""
        cfg, view = self.cfg, sft_view(self.cfg)
        torch.manual_seed(cfg.runner.seed + self.rank)
        self.policy, selection = build_sft_policy(view, self.device, self.world_size)
        if cfg.algorithm.kl_coef > 0:  # the start weights, before a resume loads the checkpoint's
            self.reference = ReferenceWeights(self.policy.transformer)
        optimization = build_sft_optimization(self.policy.transformer, view)
        self.optimizer, self.scheduler, self.ema = optimization.optimizer, optimization.scheduler, optimization.ema
        model = cfg.rollout.model
        decoder = EnvActionDecoder(ActionNormalizer(model.action_stats_path, model.action_normalization),
                                   model.rot6d_decode, model.gripper_convention, model.gripper_command)
        ppo = cfg.algorithm.name == "ppo"
        settings = SamplerSettings(num_steps=cfg.rollout.num_denoising_steps, noise_level=cfg.rollout.noise_level,
                                   executed_steps=cfg.rollout.executed_steps, flow_shift=model.flow_shift,
                                   pooled_features=ppo)
        self.sampler = RolloutSampler(self.policy, decoder, settings, seed=cfg.runner.seed)
        if ppo:
            actor = cfg.actor
            self.critic = Critic(self.policy.transformer.config.hidden_size, actor.value_hidden_sizes,
                                 lr=actor.value_lr, weight_decay=actor.weight_decay, clip_grad=actor.clip_grad,
                                 device=self.device, seed=decision_seed(cfg.runner.seed, CRITIC_STREAM))
        if resume_dir:
            if self.critic is not None:
                self.critic.load_text((Path(resume_dir) / VALUE_HEAD_FILE).read_text())
            state = load_checkpoint(resume_dir, self.policy.transformer, self.optimizer, self.scheduler, self.ema)
            self.iteration = state.global_step
            self.counters = dict(state.extra[RL_STATE_KEY])
            self.logger.info("resumed at iteration %d (%s)%s", self.iteration, self.counters,
                             " with its value head" if self.critic is not None else "")
        value_params = sum(p.numel() for p in self.critic.head.parameters()) if self.critic is not None else 0
        reference = self.reference.num_elements if self.reference is not None else 0
        return {"iteration": self.iteration, "counters": self.counters, "trainable_params": selection.n_trainable,
                "total_params": selection.n_trainable + selection.n_frozen, "value_head_params": value_params,
                "reference_params": reference,
                "device": str(self.device)}

    # ------------------------------------------------------------------ rollouts

    def sample(self, main_images: np.ndarray, wrist_images: np.ndarray, tasks: Sequence[str],
               seeds: Sequence[int]) -> dict[str, Any]:
        """One batch of env observations -> their commands ``[B, executed_steps, 7]`` and decision ids (PPO: and
        ``values``, each decision's ``V``); each decision's chain row stays here until :meth:`update` (or
        :meth:`discard`)."""
        started = time.perf_counter()
        decisions = self.sampler.sample(main_images, wrist_images, list(tasks), seeds=list(seeds))
        first = self._num_decisions
        self._chains.append(decisions.chain)
        self._num_decisions += len(decisions)
        reply = {"actions": decisions.env_actions[:, :self.cfg.rollout.executed_steps],
                 "ids": list(range(first, self._num_decisions))}
        if self.critic is not None:
            with torch.no_grad():
                values = self.critic.values(decisions.chain.features).float()
            self._values.append(values)
            reply["values"] = values.tolist()
        return {**reply, "sample_s": time.perf_counter() - started}

    def observation_values(self, main_images: np.ndarray, wrist_images: np.ndarray, tasks: Sequence[str],
                           seeds: Sequence[int]) -> dict[str, Any]:
        """PPO: ``V`` of observations no decision is taken on (where a truncated episode stopped), read as a
        decision's is (the pooled features of a sampled chain's SDE step, seeded by ``seeds``); nothing is kept."""
        if self.critic is None:
            raise RuntimeError("observation_values needs the value head (algorithm.name=ppo)")
        started = time.perf_counter()
        decisions = self.sampler.sample(main_images, wrist_images, list(tasks), seeds=list(seeds))
        with torch.no_grad():
            values = self.critic.values(decisions.chain.features).float()
        return {"values": values.tolist(), "sample_s": time.perf_counter() - started}

    def discard(self) -> None:
        """Forget the decisions sampled since the last update (a round that did not finish)."""
        self._chains, self._values, self._num_decisions = [], [], 0

    # ------------------------------------------------------------------ update

    def update(self, decision_ids: Sequence[int], advantages: Sequence[float], iteration: int,
               returns: Sequence[float] | None = None) -> dict[str, float]:
        """PPO-clip epochs over the kept decisions of ``iteration``'s round, then forget the round's decisions.

        Each epoch shuffles the decisions (seeded by ``(seed, iteration, epoch)``) into minibatches of
        ``algorithm.minibatch_size``; each minibatch is one optimizer step: the log-probs recomputed on the stored
        chain states, the clipped loss, the gradient clipped to ``actor.clip_grad``. Without decisions (every
        group uniform) no step is taken. Metrics are means over the minibatches (``ratio_max``: the max).

        PPO: ``returns`` (one per decision, GAE's ``A + V``) are the value head's targets; each minibatch adds the
        clipped value loss against the rollout's values, and the critic takes its own AdamW step. GRPO: None."""
        started = time.perf_counter()
        chains, self._chains, self._num_decisions = self._chains, [], 0
        rollout_values, self._values = self._values, []
        if len(decision_ids) != len(advantages):
            raise ValueError(f"{len(decision_ids)} decisions, {len(advantages)} advantages")
        if (returns is None) != (self.critic is None):
            raise ValueError("returns are PPO's value targets: pass them exactly when algorithm.name=ppo")
        if returns is not None and len(returns) != len(decision_ids):
            raise ValueError(f"{len(decision_ids)} decisions, {len(returns)} returns")
        alg = self.cfg.algorithm
        sums = dict.fromkeys(_MEAN_METRICS + (_VALUE_METRICS if self.critic is not None else ())
                             + (("kl_ref",) if self.reference is not None else ()), 0.0)
        ratio_max, steps = 0.0, 0
        extra: dict[str, float] = {}
        sampled = cat_chains(chains) if chains else None
        # The round's mean old log-prob (every decision sampled, kept or not): how spread the sampling is, and a
        # fingerprint of the round (a resumed run must reproduce it exactly).
        rollout_log_prob = float(sampled.old_log_prob.double().mean()) if sampled is not None else 0.0
        if decision_ids:
            assert sampled is not None
            ids = torch.tensor(list(decision_ids), dtype=torch.long)
            chain = select_rows(sampled, ids)
            adv = torch.tensor(list(advantages), dtype=torch.float32, device=self.device)
            reference = self._reference_log_probs(chain) if self.reference is not None else None
            targets = None
            if returns is not None:
                old = torch.cat(rollout_values).index_select(0, ids.to(rollout_values[0].device)).to(self.device)
                targets = (old, torch.tensor(list(returns), dtype=torch.float32, device=self.device))
                extra = _rollout_value_metrics(*targets)
            count = len(decision_ids)
            for epoch in range(alg.update_epochs):
                shuffle = torch.Generator().manual_seed(
                    decision_seed(self.cfg.runner.seed, MINIBATCH_STREAM, iteration, epoch))
                order = torch.randperm(count, generator=shuffle)
                for start in range(0, count, alg.minibatch_size):
                    rows = order[start:start + alg.minibatch_size]
                    values = self._minibatch_step(select_rows(chain, rows), adv, targets, reference,
                                                  rows.to(self.device))
                    for name in sums:
                        sums[name] += float(values[name])
                    ratio_max = max(ratio_max, float(values["ratio_max"]))
                    steps += 1
            self.optimizer.zero_grad(set_to_none=True)
            if self.critic is not None:
                self.critic.zero_grad()
        self.iteration = iteration
        metrics = {name: total / steps for name, total in sums.items()} if steps else {}
        return {**metrics, **({"ratio_max": ratio_max} if steps else {}), **extra, "optimizer_steps": float(steps),
                "update_decisions": float(len(decision_ids)), "rollout_log_prob_mean": rollout_log_prob,
                "lr": float(self.optimizer.param_groups[0]["lr"]),
                "update_s": time.perf_counter() - started}

    def _reference_log_probs(self, chain: ActionChain) -> torch.Tensor:
        """``[D]``: each of ``chain``'s decisions' log-prob under the start weights (one swap, minibatch-sized
        forwards, no gradient): the KL term's reference, the same for every epoch."""
        assert self.reference is not None
        size, count = self.cfg.algorithm.minibatch_size, len(chain.input_ids)
        with self.reference.swapped():
            parts = [chain_log_prob(self.policy, select_rows(chain, list(range(start, min(start + size, count)))))
                     for start in range(0, count, size)]
        return torch.cat(parts).detach().to(self.device)

    def _minibatch_step(self, part: ActionChain, adv: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor] | None,
                        reference: torch.Tensor | None, rows: torch.Tensor) -> dict[str, Any]:
        """One optimizer step on a minibatch (``rows`` of the round's kept decisions); its metrics as 0-D tensors."""
        alg = self.cfg.algorithm
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.zero_grad()
            log_prob, features = chain_log_prob(self.policy, part, features=True)
        else:
            log_prob = chain_log_prob(self.policy, part)
        loss = ppo_clip_loss(log_prob, part.old_log_prob.to(log_prob.device), adv[rows],
                             clip_ratio=alg.clip_ratio, dual_clip=alg.dual_clip,
                             ref_log_prob=None if reference is None else reference[rows], kl_coef=alg.kl_coef)
        total, metrics = loss.loss, dict(loss.metrics)
        if self.critic is not None and targets is not None:
            old_values, returns = targets
            value = clipped_value_loss(self.critic.values(features), old_values[rows], returns[rows],
                                       value_clip=alg.value_clip, huber_delta=alg.huber_delta)
            total = total + value.loss  # disjoint parameters: the head's input is detached
            metrics.update(value.metrics)
        total.backward()
        metrics["grad_norm"] = clip_grad_norm_(self.policy.transformer, self.cfg.actor.clip_grad)
        self.optimizer.step()
        self.scheduler.step()
        if self.critic is not None:
            metrics["value_grad_norm"] = self.critic.step()
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, step_dir: str, extra_files: dict[str, str] | None = None,
                        counters: dict[str, float] | None = None) -> str:
        """Collective: write ``step_dir`` (``.../global_step_<iteration>``) atomically with SFT's layout, the run's
        counters (``counters``: episodes, env steps, ...) in ``trainer_state.json``; PPO: the critic's state in
        :data:`~rlinf_cosmos3.validation.rl.VALUE_HEAD_FILE` beside the model, written by the same atomic save."""
        expected = f"global_step_{self.iteration}"
        if Path(step_dir).name != expected:
            raise ValueError(f"asked to save iteration {self.iteration} into '{step_dir}', expected '{expected}'")
        self.counters = dict(counters or self.counters)
        state = TrainerState(global_step=self.iteration, consumed_samples=int(self.counters.get("episodes", 0)),
                             extra={RL_STATE_KEY: {"iteration": self.iteration, **self.counters}})
        files = dict(extra_files or {})
        if self.critic is not None:
            files[VALUE_HEAD_FILE] = self.critic.to_text()
        path = save_checkpoint(Path(step_dir).parent, self.policy.transformer, self.optimizer, state, self.scheduler,
                               self.ema, extra_files=files)
        return str(path)

    def full_state(self) -> dict[str, Any]:
        """The consolidated weights and the optimizer's state dict (PPO: and the critic's), on the CPU (tests; small
        models)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.policy.transformer, options=options)

        def cpu(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.detach().cpu().clone()
            if isinstance(value, dict):
                return {k: cpu(v) for k, v in value.items()}
            if isinstance(value, list):
                return [cpu(v) for v in value]
            return value

        state = {"weights": weights, "optimizer": cpu(self.optimizer.state_dict())}
        if self.critic is not None:
            state["critic"] = cpu(self.critic.state_dict())
        return state


def _rollout_value_metrics(values: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """The round's rollout values against their GAE returns, before the update: ``value_mean``, ``return_mean`` and
    the explained variance ``1 - Var(R - V) / Var(R)`` (absent when the returns do not vary)."""
    out = {"value_mean": float(values.double().mean()), "return_mean": float(returns.double().mean())}
    var_returns = float(returns.double().var(unbiased=False))
    if var_returns > 0:
        out["explained_variance"] = 1.0 - float((returns - values).double().var(unbiased=False)) / var_returns
    return out
