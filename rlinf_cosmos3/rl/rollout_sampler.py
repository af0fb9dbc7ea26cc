"""The collocated rollout sampler: env observations in, env commands out, on the actor's own weights.

RLinf's "collocated" mode: the rollout model IS the training model, so there is no weight sync and no server
(SGLang returns no action log-probs). One call serves a batch of envs:

1. :func:`~rlinf_cosmos3.rl.observation_encoding.encode_observations`: the eval's canvas, condition latent and
   caption, through the policy's processor;
2. :func:`~rlinf_cosmos3.rl.action_chain.sample_action_chain`: the hybrid ODE/SDE chain on the scheduler's grid
   (with the eval's flow shift), the whole batch in the policy's packed forward at every denoising step;
3. :class:`~rlinf_cosmos3.actions.decoding.EnvActionDecoder`: the eval adapter's own decoding to ``[B, 16, 7]``.

What a decision keeps for training is its :class:`~rlinf_cosmos3.rl.action_chain.ActionChain` row: prompt ids,
the state at its SDE step, ``t``/``t_next``, the drawn action tokens, the mask, the old log-prob and the
normalised chunk. Reward and done come from the env loop.

Seeds: every decision draws from a generator of its own, seeded by the caller (:func:`decision_seed` of the
round, env and decision: the draws then do not depend on how the envs were batched, and a re-run env repeats
its episode) or, if not given, from the sampler's seeded generator. ``deterministic=True`` is the eval's
sampler: noise level 0, the Euler ODE from the seeded initial noise, no density (``old_log_prob`` NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlinf_cosmos3.actions.decoding import EnvActionDecoder
from rlinf_cosmos3.config.model_settings import NUM_INFERENCE_STEPS, RECIPE
from rlinf_cosmos3.rl.action_chain import ActionChain, sample_action_chain
from rlinf_cosmos3.rl.observation_encoding import EncodedObservations, encode_observations

__all__ = ["RolloutDecisions", "RolloutSampler", "SamplerSettings", "decision_seed"]

_SEED_BITS = 63


def decision_seed(*keys: int) -> int:
    """A generator seed from non-negative integer keys (e.g. run seed, round, env, decision), well mixed
    (numpy's ``SeedSequence``): nearby keys give unrelated streams, and the seed is the same in every process."""
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint32)
    return int((int(state[0]) << 32 | int(state[1])) & ((1 << _SEED_BITS) - 1))


@dataclass(frozen=True)
class SamplerSettings:
    """How the rollout chain samples (the runner fills it from its RL config)."""

    num_steps: int = NUM_INFERENCE_STEPS
    """Euler steps on the scheduler's grid: the eval's 30 grid points."""
    noise_level: float = 0.5
    """``a`` of the flow-SDE step (RLinf: 0.5); the deterministic mode uses 0."""
    executed_steps: int = RECIPE.action_horizon
    """Chunk steps the env runs per decision, and the ones the log-prob counts."""
    flow_shift: float | None = 5.0
    """The eval's ``rollout.model.flow_shift`` (set on the policy's scheduler, as the embedded backend sets it per
    request), so the grid is the evaluated sampler's; None: the scheduler's own."""
    sde_candidates: tuple[int, ...] | None = None
    """Grid steps a decision's SDE step is drawn from; None: all of them."""
    pooled_features: bool = False
    """Keep each decision's pooled feature (``chain.features``) from its SDE step's forward: PPO's value input."""

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.noise_level < 0:
            raise ValueError(f"noise_level must be >= 0, got {self.noise_level}")
        if self.executed_steps < 1:
            raise ValueError(f"executed_steps must be >= 1, got {self.executed_steps}")
        if self.flow_shift is not None and self.flow_shift <= 0:
            raise ValueError(f"flow_shift must be > 0 or None, got {self.flow_shift}")


@dataclass
class RolloutDecisions:
    """One sampling call's decisions, in the order of the observations."""

    env_actions: np.ndarray
    """``[B, horizon, 7]`` float32: the commands the envs run (the first ``executed_steps`` of each chunk)."""
    chain: ActionChain
    """Per decision what training needs (``chain.actions``: the normalised ``[B, horizon, 10]`` chunk)."""
    observations: EncodedObservations
    """The condition latents, prompt ids and canvases the chain was conditioned on."""
    seeds: list[int]
    """Each decision's generator seed: sampling the same observation with it repeats the decision."""
    deterministic: bool

    def __len__(self) -> int:
        return len(self.seeds)


class RolloutSampler:
    """Samples a batch of env decisions with the policy's current weights (see the module docstring)."""

    def __init__(self, policy: Any, decoder: EnvActionDecoder, settings: SamplerSettings | None = None, *,
                 seed: int = 0) -> None:
        self.policy = policy
        self.decoder = decoder
        self.settings = settings or SamplerSettings()
        if self.settings.executed_steps > policy.cfg.action_horizon:
            raise ValueError(f"executed_steps {self.settings.executed_steps} exceeds the policy's action horizon "
                             f"{policy.cfg.action_horizon}")
        self._seeds = torch.Generator().manual_seed(int(seed))

    def _generators(self, seeds: Sequence[int]) -> list[torch.Generator]:
        device = self.policy.device
        return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    @torch.no_grad()
    def sample(self, main_images: Any, wrist_images: Any, task_descriptions: Sequence[str], *,
               seeds: Sequence[int] | None = None, deterministic: bool = False) -> RolloutDecisions:
        """Decisions for a batch of env observations (``[B, h, w, 3]`` uint8 upright views, ``B`` tasks).
        ``seeds``: one per observation (:func:`decision_seed`); None draws them from the sampler's generator."""
        cfg = self.settings
        encoded = encode_observations(self.policy, main_images, wrist_images, task_descriptions)
        batch = len(encoded)
        if seeds is None:
            seeds = torch.randint(torch.iinfo(torch.int64).max, (batch,), generator=self._seeds).tolist()
        elif len(seeds) != batch:
            raise ValueError(f"{len(seeds)} seeds for {batch} observations")
        if cfg.flow_shift is not None:
            self.policy.pipeline.use_flow_shift(cfg.flow_shift)
        candidates = None if cfg.sde_candidates is None else torch.tensor(cfg.sde_candidates, dtype=torch.long)
        chain = sample_action_chain(
            self.policy, encoded.latents, encoded.input_ids, num_steps=cfg.num_steps,
            noise_level=0.0 if deterministic else cfg.noise_level, executed_steps=cfg.executed_steps,
            generator=self._generators(seeds), sde_candidates=candidates,
            features=cfg.pooled_features and not deterministic)
        env_actions = self.decoder(chain.actions.float().cpu().numpy())
        return RolloutDecisions(env_actions=env_actions, chain=chain, observations=encoded,
                                seeds=[int(s) for s in seeds], deterministic=deterministic)
