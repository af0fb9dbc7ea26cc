"""The RL recipe (issue #32): one dataclass per section, defaults = the recipe, and the checks that need nothing
but the config.

Sections follow RLinf's embodied YAMLs: ``algorithm`` (GRPO or PPO and their constants), ``rollout`` (envs
per round and the flow-SDE sampler), ``actor`` (what is trained, learning rates, value head), ``runner``
(iterations, checkpoints, online eval), with ``cluster`` and ``env`` (:mod:`rlinf_cosmos3.config.rl_env`) as the
other run configs have them. The schema of ``examples/rl/config/*.yaml`` (Hydra's config store: ``rl_schema``);
:meth:`RLConfig.validate` checks the values and raises :class:`ConfigError` naming the field and the fix, as the
SFT and eval schemas do; :func:`rlinf_cosmos3.validation.rl.load_rl_config` adds what is on disk (the model
directory and its identity, the stats file, the checkpoint to resume, the simulator environment).

The actor reuses the SFT rank's pieces (policy loading, FSDP2, AdamW, checkpoints); :func:`sft_view` is the RL run
as those pieces read an SFT config.

Why these defaults (docs/rl.md, "The algorithm"): RLinf's LIBERO recipes for pi0 (``libero_*_grpo_openpi``,
``libero_*_ppo_openpi``): group size 8, clip 0.2 both ways, dual clip 3, GRPO 2 update epochs (PPO 4), no KL
term, gamma 0.99, lambda 0.95, value clip 0.2, Huber delta 10, noise level 0.5 with flow-SDE, the action
expert trained (``train_expert_only``), which is here the generation tower + action heads. The sizes (32
envs, 20 iterations) are a first guess for the issue's budget (~30 min on one GPU host), to be sized from
the measured rollout throughput.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlinf_cosmos3.config.base import PRECISIONS, require, require_one_of
from rlinf_cosmos3.config.cluster import ClusterConfig
from rlinf_cosmos3.config.data import LiberoDataConfig
from rlinf_cosmos3.config.model_settings import NUM_INFERENCE_STEPS, RECIPE
from rlinf_cosmos3.config.rl_env import RLEnvConfig
from rlinf_cosmos3.config.rollout import RolloutModelConfig
from rlinf_cosmos3.config.sft import (
    ATTENTION_BACKENDS,
    DEFAULT_MAX_TOKENS_PER_PACK,
    ActorConfig,
    DataLoaderConfig,
    ModelConfig,
    OnlineEvalConfig,
    OptimConfig,
    RunnerConfig,
    SFTConfig,
)

ALGORITHMS = ("grpo", "ppo")
"""``algorithm.name``: GRPO (group-normalised episode returns, no critic) or PPO (value head + GAE)."""
SDE_MODES = ("hybrid", "every_step")
"""``rollout.sde_mode``: one flow-SDE step per decision, the others ODE (RLinf's ``flow_sde``, piRL's hybrid)
or every denoising step stochastic (``flow_noise``-like)."""
IMPLEMENTED_SDE_MODES = ("hybrid",)
"""What :mod:`rlinf_cosmos3.rl.action_chain` samples today: one SDE step per decision, whose state it keeps."""
TRAINABLE_PARTS = ("generation", "all")
"""``actor.trainable``: the generation tower + action heads (:data:`GENERATION_TOWER_KEYS`), or every
parameter. Both are ``actor.model.keys_to_select`` values of the SFT recipes (the reference's list, and
null for the small preset), applied by the same ``components.optim.select_trainable``."""
GENERATION_TOWER_KEYS = ("moe_gen", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "norm_added_q",
                         "norm_added_k", "time_embedder", "proj_in", "proj_out", "action_modality_embed")
"""The SFT reference's ``actor.model.keys_to_select`` (``examples/sft/config/model/cosmos3.yaml``, from
cosmos-framework's LIBERO recipe): the generation pathway, its attention, the time embedder, the VAE and
action projections. ``tests/test_rl_config.py`` keeps the two equal."""


@dataclass
class RLAlgorithmConfig:
    """``algorithm``: which policy-gradient method and its constants."""

    name: str = "grpo"
    """``grpo`` (the issue's first algorithm: no critic, one number per episode) or ``ppo``."""
    group_size: int = 8
    """Rollouts from the same (task, init state) that form a GRPO group (RLinf: 8). PPO runs them too."""
    clip_ratio: float = 0.2
    """PPO clip ``eps``: the ratio is clipped to ``[1 - eps, 1 + eps]``."""
    dual_clip: float | None = 3.0
    """Cap of ``-A r`` for negative advantages at ``dual_clip * |A|`` (> 1); null: off."""
    update_epochs: int = 2
    """Passes over an iteration's decisions (RLinf: GRPO 2, PPO 4)."""
    minibatch_size: int = 128
    """Decisions per optimizer step; an iteration's decisions are shuffled into minibatches of this size."""
    kl_coef: float = 0.0
    """Weight of the k3 KL toward the starting policy (``rollout.model.model_path``'s weights, the trainable part kept
    on the host: :mod:`rlinf_cosmos3.rl.reference`); 0 (RLinf's ``kl_beta`` in its LIBERO recipes): no reference."""
    advantage_eps: float = 1e-6
    """Added to the group's std in GRPO (RLinf's 1e-6)."""
    gamma: float = 0.99
    """PPO: discount per decision."""
    gae_lambda: float = 0.95
    """PPO: GAE's lambda."""
    value_clip: float = 0.2
    """PPO: the value head's prediction is clipped to ``old +- value_clip`` in the loss."""
    huber_delta: float = 10.0
    """PPO: Huber threshold of the value loss (10: the squared error for 0/1 rewards)."""


@dataclass
class RLRolloutConfig:
    """``rollout``: one round of episodes and the stochastic sampler that plays them."""

    num_envs: int = 32
    """Episodes per round, one per env; ``num_envs / group_size`` init states per round."""
    noise_level: float = 0.5
    """``a`` in the flow-SDE ``sigma_t = a sqrt(t / (1 - t))`` (RLinf: 0.5)."""
    sde_mode: str = "hybrid"
    """One of :data:`SDE_MODES`; only ``hybrid`` is implemented."""
    num_denoising_steps: int = NUM_INFERENCE_STEPS
    """Euler steps of the rollout chain: the eval's 30 grid points, so the rollout policy is the Euler
    counterpart of the evaluated UniPC sampler on the same grid."""
    executed_steps: int = RECIPE.action_horizon
    """Commands of each chunk the env runs before the next decision, and the chunk steps the log-prob counts:
    the whole chunk (16), as the eval runs it (``env.eval.open_loop_steps`` null)."""
    model: RolloutModelConfig = field(default_factory=RolloutModelConfig)
    """The diffusers directory RL starts from and the settings it was trained with, as an eval's ``rollout.model``
    states them (checked against its ``model_identity.json`` before anything starts). Collocated: the actor
    trains these weights and the rollouts sample with them. Its ``flow_shift``, ``gripper_command`` and
    ``rot6d_decode`` act on the rollouts as on an eval; the chain's steps are ``rollout.num_denoising_steps``."""


@dataclass
class RLActorConfig:
    """``actor``: what is trained and how fast."""

    trainable: str = "generation"
    """One of :data:`TRAINABLE_PARTS`. ``generation`` as RLinf's pi0 (``train_expert_only``) and NVIDIA's SFT
    recipe: the understanding tower, which reads the instruction, stays as SFT left it, and AdamW keeps
    no state for it."""
    lr: float = 5e-5
    """Policy learning rate, constant: 10x below the small preset's SFT 5e-4 (RLinf's pi0: 5e-6, 5x below
    openpi's SFT peak 2.5e-5). To be tuned on the measured runs."""
    value_lr: float = 1e-4
    """PPO: the value head's learning rate (RLinf's ``value_lr``)."""
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    """Global gradient-norm clip."""
    value_hidden_sizes: list[int] = field(default_factory=lambda: [512, 256, 128])
    """PPO: hidden widths of the value head's MLP (RLinf's pi0)."""
    precision: str = "bf16"
    """Compute dtype on a GPU (FSDP2 mixed precision over fp32 master weights, as SFT); a CPU run is fp32."""
    activation_checkpointing: bool = True
    """Recompute decoder layers in the update's backward (SFT's default; false is faster where memory allows)."""
    max_tokens_per_pack: int | None = DEFAULT_MAX_TOKENS_PER_PACK
    """Decisions share one transformer call up to this many tokens, in the rollouts and the update (SFT's packing)."""
    attention_backend: str = "auto"
    """Packed attention: ``flex`` (GPU), ``loop`` (any device) or ``auto``."""


@dataclass
class RLRunnerConfig:
    """``runner``: how long, how often to save and evaluate."""

    experiment_name: str = "libero_rl_cosmos3"
    logs_dir: str = "logs"
    """Where the run directory ``<logs_dir>/<timestamp>-<config>/`` (log, TensorBoard, config) goes."""
    log_path: str = "logs"
    """Root for checkpoints: ``<log_path>/<experiment_name>/checkpoints/global_step_<iteration>/``."""
    max_iterations: int = 20
    """Iterations of (rollout round, ``update_epochs`` passes)."""
    save_interval: int = 5
    """Save ``global_step_<iteration>`` every this many iterations (and after the last)."""
    resume_dir: str | None = None
    """A ``.../checkpoints/global_step_<N>`` of an RL run to continue from exactly (policy, optimizer, RNG,
    iteration, the episode and env-step counts)."""
    max_checkpoints_to_keep: int | None = None
    """Keep only the newest K checkpoints (SFT's retention: the ``resume_dir`` one is never deleted); None: all."""
    eval_interval: int | None = None
    """Evaluate the checkpoint saved at that iteration in LIBERO (SFT's online evaluation: converted, then the
    eval config ``online_eval.config_name`` with the embedded backend, in a process of its own); a multiple of
    ``save_interval``; null: no evaluation during training."""
    online_eval: OnlineEvalConfig = field(default_factory=OnlineEvalConfig)
    """SFT's ``runner.online_eval``; it evaluates the suite and tasks of ``env`` unless its overrides set
    ``env.eval.suite`` / ``env.eval.task_ids`` (:func:`online_eval_of`)."""
    seed: int = 42
    """Seeds the init states' order, every decision's noise (per iteration, env, attempt and decision) and the
    minibatch shuffles."""
    max_wall_time_s: float | None = None
    """Stop cleanly once the iterations have run this long (seconds from the first rollout): the iteration in
    progress finishes, a checkpoint is saved and the run exits 0, naming the checkpoint to continue from with
    ``resume_dir`` (a time-limited job then loses nothing). None: no limit."""


@dataclass
class RLConfig:
    """The RL recipe."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    algorithm: RLAlgorithmConfig = field(default_factory=RLAlgorithmConfig)
    rollout: RLRolloutConfig = field(default_factory=RLRolloutConfig)
    actor: RLActorConfig = field(default_factory=RLActorConfig)
    env: RLEnvConfig = field(default_factory=RLEnvConfig)
    runner: RLRunnerConfig = field(default_factory=RLRunnerConfig)

    def validate(self) -> RLConfig:
        """Every value rule; raises :class:`ConfigError` naming the first bad field and its fix. (``rollout.model``
        is checked with the model directory it names, in :mod:`rlinf_cosmos3.validation.rl`.)"""
        check_algorithm(self.algorithm)
        check_rollout(self.rollout, self.algorithm)
        check_actor(self.actor)
        check_runner(self.runner)
        self.cluster.validate("cluster")
        require(self.cluster.world_size == 1, "cluster.num_gpus_per_node" if self.cluster.use_gpus
                else "cluster.num_cpu_ranks_per_node",
                f"the RL actor runs on one rank for now, this config asks for {self.cluster.world_size}",
                "use one GPU (cluster.num_gpus_per_node=1) or one CPU rank (cluster.num_cpu_ranks_per_node=1); "
                "sharding the collocated sampler over ranks is not built yet (docs/rl.md)")
        self.env.validate(self.rollout.num_envs, self.rollout.executed_steps)
        return self


def online_eval_of(cfg: RLConfig) -> OnlineEvalConfig:
    """``runner.online_eval`` evaluating what the rollouts train on: the eval config's suite and tasks become the RL
    env's (``env.eval.suite``, ``env.eval.task_ids`` put before the user's overrides), unless those overrides set
    them. Without this, the recipe's eval config (libero_spatial task 0) would silently judge a run on other tasks.
    """
    online, env = cfg.runner.online_eval, cfg.env
    named = {override.lstrip("+~").split("=", 1)[0] for override in online.overrides}
    implied = [] if "env.eval.suite" in named or "env.eval.suites" in named else [f"env.eval.suite={env.suite}"]
    if "env.eval.task_ids" not in named:
        tasks = "null" if env.task_ids is None else "[" + ",".join(str(t) for t in env.task_ids) + "]"
        implied.append(f"env.eval.task_ids={tasks}")
    return dataclasses.replace(online, overrides=[*implied, *online.overrides])


def sft_view(cfg: RLConfig) -> SFTConfig:
    """The RL run as the SFT pieces read an SFT config: the policy loader and FSDP2 wrapping
    (``components.sft_trainer``), AdamW and its schedule, the checkpoint sizing, disk checks and retention
    (``runners.checkpoint_space``), and the online evaluation. One model, one copy of that code.

    What RL sets differently: the trainable part is ``actor.trainable``; the learning rate is constant (no
    warm-up, no decay); no EMA (RL checkpoints convert their trained weights); no action-head LR multipliers;
    the model settings are ``rollout.model``'s (checked against the model's identity)."""
    model, actor, runner = cfg.rollout.model, cfg.actor, cfg.runner
    steps = max(1, runner.max_iterations * cfg.algorithm.update_epochs)
    return SFTConfig(
        cluster=cfg.cluster,
        runner=RunnerConfig(
            experiment_name=runner.experiment_name, logs_dir=runner.logs_dir, log_path=runner.log_path,
            max_steps=runner.max_iterations, save_interval=runner.save_interval, log_interval=1,
            resume_dir=runner.resume_dir, max_checkpoints_to_keep=runner.max_checkpoints_to_keep, seed=runner.seed,
            eval_interval=runner.eval_interval, online_eval=online_eval_of(cfg)),
        actor=ActorConfig(
            micro_batch_size=1, global_batch_size=1, max_tokens_per_pack=actor.max_tokens_per_pack,
            model=ModelConfig(
                model_path=model.model_path, precision=actor.precision,
                activation_checkpointing=actor.activation_checkpointing, ema_enabled=False,
                keys_to_select=trainable_keys(actor.trainable), lr_multipliers={},
                action_normalization=model.action_normalization, domain_name=model.domain_name,
                action_horizon=model.num_action_chunks, num_frames=model.num_frames, canvas_height=model.height,
                canvas_width=model.width, fps=model.fps, caption_style=model.caption_style,
                attention_backend=actor.attention_backend),
            optim=OptimConfig(lr=actor.lr, weight_decay=actor.weight_decay, clip_grad=actor.clip_grad,
                              lr_warmup_steps=0, total_training_steps=steps, min_lr_rate=1.0)),
        data=DataLoaderConfig(dataset=LiberoDataConfig(
            stats_path=model.action_stats_path, gripper_convention=model.gripper_convention, fps=model.fps,
            chunk_length=model.num_action_chunks, num_frames=model.num_frames,
            normalization=model.action_normalization)),
    )


def trainable_keys(trainable: str) -> list[str] | None:
    """``actor.trainable`` as ``select_trainable``'s ``keys_to_select`` (None: every parameter)."""
    require_one_of(trainable, TRAINABLE_PARTS, "actor.trainable")
    return None if trainable == "all" else list(GENERATION_TOWER_KEYS)


def check_algorithm(alg: RLAlgorithmConfig) -> None:
    require(alg.name in ALGORITHMS, "algorithm.name", f"unknown algorithm '{alg.name}'",
            f"use one of {list(ALGORITHMS)}")
    least = 2 if alg.name == "grpo" else 1
    require(alg.group_size >= least, "algorithm.group_size",
            f"must be >= {least} for {alg.name}, got {alg.group_size}"
            + (" (a group of one has no baseline: its std is undefined)" if alg.name == "grpo" else ""),
            "use e.g. algorithm.group_size=8 (RLinf's)")
    require(0.0 < alg.clip_ratio < 1.0, "algorithm.clip_ratio", f"must be in (0, 1), got {alg.clip_ratio}",
            "use 0.2")
    require(alg.dual_clip is None or alg.dual_clip > 1.0, "algorithm.dual_clip",
            f"must be > 1 or null, got {alg.dual_clip}", "use 3.0, or null to turn dual clipping off")
    require(alg.update_epochs >= 1, "algorithm.update_epochs", f"must be >= 1, got {alg.update_epochs}",
            "use 2 (GRPO) or 4 (PPO), RLinf's")
    require(alg.minibatch_size >= 1, "algorithm.minibatch_size", f"must be >= 1, got {alg.minibatch_size}",
            "use e.g. 128 decisions per optimizer step")
    require(alg.kl_coef >= 0.0, "algorithm.kl_coef", f"must be >= 0, got {alg.kl_coef}", "use 0 to turn it off")
    require(alg.advantage_eps > 0.0, "algorithm.advantage_eps", f"must be > 0, got {alg.advantage_eps}",
            "use 1e-6")
    require(0.0 < alg.gamma <= 1.0, "algorithm.gamma", f"must be in (0, 1], got {alg.gamma}", "use 0.99")
    require(0.0 <= alg.gae_lambda <= 1.0, "algorithm.gae_lambda", f"must be in [0, 1], got {alg.gae_lambda}",
            "use 0.95")
    require(alg.value_clip > 0.0, "algorithm.value_clip", f"must be > 0, got {alg.value_clip}", "use 0.2")
    require(alg.huber_delta > 0.0, "algorithm.huber_delta", f"must be > 0, got {alg.huber_delta}", "use 10.0")


def check_rollout(rollout: RLRolloutConfig, alg: RLAlgorithmConfig) -> None:
    require(rollout.num_envs >= 1, "rollout.num_envs", f"must be >= 1, got {rollout.num_envs}",
            f"use a multiple of algorithm.group_size={alg.group_size}")
    size = alg.group_size
    nearest = max(size, round(rollout.num_envs / size) * size) if size >= 1 else rollout.num_envs
    require(size < 1 or rollout.num_envs % size == 0, "rollout.num_envs",
            f"{rollout.num_envs} envs do not split into groups of algorithm.group_size={size} (every group's "
            "rollouts run in the same round)",
            f"use a multiple of {size}, e.g. rollout.num_envs={nearest}, or change algorithm.group_size")
    require(rollout.noise_level > 0.0, "rollout.noise_level",
            f"must be > 0, got {rollout.noise_level} (0 is the deterministic ODE: no density, no log-prob)",
            "use 0.5 (RLinf's)")
    require(rollout.sde_mode in SDE_MODES, "rollout.sde_mode", f"unknown mode '{rollout.sde_mode}'",
            f"use one of {list(SDE_MODES)}")
    require(rollout.sde_mode in IMPLEMENTED_SDE_MODES, "rollout.sde_mode",
            f"'{rollout.sde_mode}' is not implemented yet: the action chain keeps the state of one SDE step "
            "per decision", "use rollout.sde_mode=hybrid")
    require(rollout.num_denoising_steps >= 1, "rollout.num_denoising_steps",
            f"must be >= 1, got {rollout.num_denoising_steps}", f"use {NUM_INFERENCE_STEPS} (the eval's)")
    require(1 <= rollout.executed_steps, "rollout.executed_steps",
            f"must be >= 1, got {rollout.executed_steps}",
            f"use the model's action horizon ({RECIPE.action_horizon} in the recipe) or fewer")


def check_actor(actor: RLActorConfig) -> None:
    require_one_of(actor.trainable, TRAINABLE_PARTS, "actor.trainable")
    require(actor.lr > 0.0, "actor.lr", f"must be > 0, got {actor.lr}", "use e.g. 5e-5")
    require(actor.value_lr > 0.0, "actor.value_lr", f"must be > 0, got {actor.value_lr}", "use e.g. 1e-4")
    require(actor.weight_decay >= 0.0, "actor.weight_decay", f"must be >= 0, got {actor.weight_decay}",
            "use 0.01, or 0 for none")
    require(actor.clip_grad > 0.0, "actor.clip_grad", f"must be > 0, got {actor.clip_grad}", "use 1.0")
    require(all(h >= 1 for h in actor.value_hidden_sizes), "actor.value_hidden_sizes",
            f"widths must be >= 1, got {list(actor.value_hidden_sizes)}", "use e.g. [512, 256, 128]")
    require_one_of(actor.precision, PRECISIONS, "actor.precision")
    require(actor.max_tokens_per_pack is None or actor.max_tokens_per_pack >= 1, "actor.max_tokens_per_pack",
            f"must be >= 1 or null, got {actor.max_tokens_per_pack}", "use e.g. 74000 (SFT's), or null")
    require_one_of(actor.attention_backend, ATTENTION_BACKENDS, "actor.attention_backend")


def check_runner(runner: RLRunnerConfig) -> None:
    require(runner.max_iterations >= 1, "runner.max_iterations", f"must be >= 1, got {runner.max_iterations}",
            "use e.g. runner.max_iterations=20")
    require(runner.save_interval >= 1, "runner.save_interval", f"must be >= 1, got {runner.save_interval}",
            "use e.g. runner.save_interval=5")
    interval = runner.eval_interval
    if interval is not None:
        require(interval >= 1, "runner.eval_interval", f"must be >= 1 or null, got {interval}",
                f"use a multiple of runner.save_interval={runner.save_interval}, or null for no evaluation")
        require(interval % runner.save_interval == 0, "runner.eval_interval",
                f"{interval} is not a multiple of runner.save_interval={runner.save_interval}: each evaluation "
                "converts the checkpoint saved at its iteration",
                f"use a multiple of {runner.save_interval}, e.g. runner.eval_interval={runner.save_interval}")
    require(runner.max_wall_time_s is None or runner.max_wall_time_s > 0, "runner.max_wall_time_s",
            f"must be > 0 or null, got {runner.max_wall_time_s}",
            "give the run's time limit in seconds (it stops with a checkpoint), or null for none")
    keep = runner.max_checkpoints_to_keep
    require(keep is None or keep >= 1, "runner.max_checkpoints_to_keep", f"must be >= 1 or null (keep all), got {keep}",
            "set it to the number of newest checkpoints to keep, e.g. runner.max_checkpoints_to_keep=2")


HYDRA_SCHEMA = "rl_schema"
"""Name of :class:`RLConfig` in Hydra's config store: the first entry of an RL YAML's ``defaults``, so every field
of the schema can be set from the command line and an unknown key is an error."""


def register_hydra_schema() -> None:
    """Put :class:`RLConfig` into Hydra's config store (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=HYDRA_SCHEMA, node=RLConfig)
