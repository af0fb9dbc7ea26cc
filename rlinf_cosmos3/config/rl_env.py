"""The ``env`` section of an RL run: the LIBERO envs its rollouts run in, and which starts they sample.

The rollouts reuse the eval's env workers (:mod:`rlinf_cosmos3.workers.env`): the same slots, simulator
processes, settle steps, step caps and crash handling. This section holds only what RL chooses; the env
workers' own config (:class:`~rlinf_cosmos3.config.env.EnvEvalConfig`) is derived from it and from
``rollout`` (:meth:`RLEnvConfig.env_worker_config`), so the envs per round are stated once
(``rollout.num_envs``) and a chunk runs exactly the steps the log-prob counts (``rollout.executed_steps``).

Why init states 0-39 by default: the issue's protocol trains on init states 0-39 and holds out 40-49, so the
held-out success is measured on starts RL never saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_cosmos3.config.base import require
from rlinf_cosmos3.config.env import EnvEvalConfig
from rlinf_cosmos3.config.libero_suites import NUM_SETTLE_STEPS

TRAIN_INIT_STATES = 40
"""Init states ``0..39`` are RL's by default; ``40..49`` stay held out for evaluation (the issue's protocol)."""


@dataclass
class RLEnvConfig:
    """``env``: the suite, the (task, init state) starts the rollouts sample, and the env layout."""

    suite: str = "libero_spatial"
    task_ids: list[int] | None = None
    """Tasks whose starts the rollouts sample; None: every task of the suite."""
    init_state_ids: list[int] = field(default_factory=lambda: list(range(TRAIN_INIT_STATES)))
    """LIBERO fixed init states the rollouts start from (every task's): 0..39, leaving 40..49 held out."""
    num_workers: int = 1
    """Env worker actors; ``rollout.num_envs`` must split evenly over ``num_workers x pipeline_stage_num``."""
    pipeline_stage_num: int = 2
    """Env groups per worker: while one group is simulated, the others' observations are sampled."""
    max_episode_steps: int | None = None
    """Step cap including the settle steps; None: the suite's (libero_spatial 220), as the eval."""
    num_settle_steps: int = NUM_SETTLE_STEPS
    image_size: int = 256
    seed: int = 0
    """Seed handed to every LIBERO env when it is built (the eval's)."""
    sim_timeout_s: float = 300.0
    sim_startup_timeout_s: float = 120.0
    max_episode_retries: int = 2
    """Re-runs of an episode whose simulator crashed; its decisions so far are dropped, never trained on.
    After the last re-run it is left out of the round (its GRPO group is one episode short)."""
    python: str | None = None
    """Interpreter of the simulator environment; None: ``.venv-libero`` (``rlinf_cosmos3.paths.libero_python``)."""

    def env_worker_config(self, num_envs: int, executed_steps: int,
                          final_observations: bool = False) -> EnvEvalConfig:
        """The env workers' config: ``num_envs`` slots, ``executed_steps`` commands per chunk, episodes ending at the
        first success (the sparse reward's decision), no videos; ``final_observations``: a truncated episode's last
        observation comes back with its result (PPO). The episodes themselves are handed per round."""
        return EnvEvalConfig(
            suite=self.suite, task_ids=None if self.task_ids is None else list(self.task_ids),
            init_state_ids=list(self.init_state_ids), total_num_envs=num_envs, num_workers=self.num_workers,
            max_episode_steps=self.max_episode_steps, num_settle_steps=self.num_settle_steps,
            open_loop_steps=executed_steps, stop_on_success=True, image_size=self.image_size, seed=self.seed,
            save_video="none", sim_timeout_s=self.sim_timeout_s, sim_startup_timeout_s=self.sim_startup_timeout_s,
            max_episode_retries=self.max_episode_retries, python=self.python, final_observations=final_observations)

    def validate(self, num_envs: int, executed_steps: int) -> EnvEvalConfig:
        """The section's values; returns the env workers' config, validated. The layout is checked here first so
        its error names ``rollout.num_envs``, the field that sets the env count."""
        require(self.num_workers >= 1, "env.num_workers", f"must be >= 1, got {self.num_workers}", "use 1")
        require(self.pipeline_stage_num >= 1, "env.pipeline_stage_num", f"must be >= 1, got {self.pipeline_stage_num}",
                "use 2 (simulation and sampling overlap) or 1")
        groups = self.num_workers * self.pipeline_stage_num
        require(num_envs % groups == 0, "rollout.num_envs",
                f"{num_envs} envs cannot be split evenly over env.num_workers={self.num_workers} x "
                f"env.pipeline_stage_num={self.pipeline_stage_num} env groups",
                f"make rollout.num_envs a multiple of {groups} (and of algorithm.group_size), or change the layout")
        return self.env_worker_config(num_envs, executed_steps).validate(
            self.pipeline_stage_num, root="env", stage_field="env.pipeline_stage_num")
