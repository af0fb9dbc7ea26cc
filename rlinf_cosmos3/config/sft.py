"""The SFT run config: one dataclass per YAML section, and the checks that need nothing but the config.

Sections mirror the reference recipe (RLinf's ``libero_sft_cosmos3.yaml``): ``cluster``, ``runner``,
``actor`` (with ``actor.model`` and ``actor.optim``) and ``data``. Each section checks its values in
``validate()`` (batch sizes divide, names are known, ranges hold) and :meth:`SFTConfig.validate` runs them
all, with the reader's settings against the model's; ``actor.model`` inherits the objective's fields and
their check from :class:`~rlinf_cosmos3.config.objective.ObjectiveConfig`. The checks that read what is on
disk (model directory, stats file, dataset, checkpoint to resume, GPUs) are in
:mod:`rlinf_cosmos3.validation.sft`, whose ``preflight`` runs everything once before Ray starts and raises
:class:`ConfigError` naming the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_cosmos3.config.base import PRECISIONS, ConfigError, require
from rlinf_cosmos3.config.cluster import ClusterConfig
from rlinf_cosmos3.config.data import DATA_SETTING_KEYS, LiberoDataConfig
from rlinf_cosmos3.config.model_settings import CAPTION_STYLES, RECIPE, ModelSettings, read_settings
from rlinf_cosmos3.config.objective import (
    ATTENTION_BACKENDS as ATTENTION_BACKENDS,  # re-exported for config/rl.py; declared in config/objective.py
)
from rlinf_cosmos3.config.objective import ObjectiveConfig
from rlinf_cosmos3.paths import REPO_ROOT

DEFAULT_MAX_TOKENS_PER_PACK = 74_000
"""cosmos-framework's LIBERO recipe packs samples up to ``max_num_tokens_after_packing`` = 74,000 tokens per
transformer call (~174 LIBERO samples of 424 tokens); also ``PolicyConfig``'s default."""


@dataclass
class ModelConfig(ObjectiveConfig):
    """``actor.model``: which Cosmos3 diffusers directory to fine-tune, how to hold it, the model settings it
    trains and (inherited, keys ``actor.model.<field>``) the objective it trains with."""

    model_path: str = "???"
    """Diffusers Cosmos3 directory (model_index.json, transformer/, vae/, text_tokenizer/, scheduler/)."""
    precision: str = "bf16"
    """Compute dtype of the trainable transformer: FSDP2 mixed precision gathers the parameters in it for
    forward and backward and reduces gradients in fp32; the sharded parameters themselves keep the dtype
    they were loaded in (fp32 master weights), and AdamW's states follow them."""
    load_to_device: bool = False
    """False: build on CPU/meta and let FSDP2 shard onto the GPUs (never the whole model on one device).
    True (the reference's other mode, whole model on the GPU first) is rejected: not implemented."""
    activation_checkpointing: bool = True
    """Recompute decoder layers in backward, as the recipe does (less activation memory per micro-batch of
    32); false is faster where memory allows and is needed for ``compile_blocks``."""
    reshard_after_forward: bool = True
    """FSDP2: free gathered layer parameters after forward (False: keep them until backward; faster,
    costs one unsharded copy of the layers per GPU)."""
    compile_blocks: bool = False
    """``torch.compile`` each decoder block's forward (GPU; faster SFT steps, measured in docs/benchmarks.md;
    off by default until a full SFT run with it has been made on a GPU)."""
    ema_enabled: bool = True
    ema_rate: float = 0.1
    """Power-EMA exponent (cosmos-framework ``ema: power``, rate 0.1)."""
    keys_to_select: list[str] | None = None
    """Train only parameters whose name contains one of these substrings (None: all)."""
    lr_multipliers: dict[str, float] = field(default_factory=dict)
    """Substring of a parameter name -> learning-rate multiplier (action heads: 5.0)."""
    # The model settings this section sets (SFT_SETTING_KEYS; declared in config/model_settings.py).
    action_normalization: str = RECIPE.normalization
    domain_name: str = RECIPE.domain_name
    action_horizon: int = RECIPE.action_horizon
    num_frames: int = RECIPE.num_frames
    canvas_height: int = RECIPE.canvas_height
    canvas_width: int = RECIPE.canvas_width
    fps: int = RECIPE.fps
    caption_style: str = RECIPE.caption_style
    """Training caption: ``diffusers`` (the one diffusers and SGLang build at serving time) or
    ``cosmos_framework`` (NVIDIA's LIBERO training caption, with the layout sentence and the chunk's
    idle frames); part of the model's identity, evaluation must prompt with the same style."""

    def validate(self, root: str = "actor.model") -> None:
        """How the model is held, its caption style and the objective (inherited check)."""
        require(self.precision in PRECISIONS, f"{root}.precision",
                f"unknown precision '{self.precision}'", f"use one of {list(PRECISIONS)}")
        require(0.0 < self.ema_rate, f"{root}.ema_rate", f"must be > 0, got {self.ema_rate}")
        require(not self.load_to_device, f"{root}.load_to_device",
                "true (the whole model placed on one GPU before sharding) is not implemented: the transformer is "
                "always built on the meta device, sharded with FSDP2 and then filled shard by shard",
                f"set {root}.load_to_device=false (the default; no GPU ever holds the whole model)")
        # Compiled blocks under diffusers' activation checkpointing with FSDP2 fail in the first backward
        # (torch.utils.checkpoint.CheckpointError: recomputed tensors differ from the saved ones; measured on an
        # H200, docs/benchmarks.md); each option alone works.
        require(not (self.compile_blocks and self.activation_checkpointing), f"{root}.compile_blocks",
                "compile_blocks=true together with activation_checkpointing=true fails in the first backward on "
                "GPU (CheckpointError: recomputed tensors differ from the forward's)",
                f"set {root}.activation_checkpointing=false (then compiled blocks are 1.64x faster on an H200, "
                "at more activation memory) or keep compile_blocks=false")
        super().validate(root)
        require(self.caption_style in CAPTION_STYLES, f"{root}.caption_style",
                f"unknown caption style '{self.caption_style}'", f"use one of {list(CAPTION_STYLES)}")
        require(all(v > 0 for v in self.lr_multipliers.values()), f"{root}.lr_multipliers",
                f"multipliers must be > 0, got {self.lr_multipliers}")


@dataclass
class OptimConfig:
    """``actor.optim``: AdamW + the lambda-linear schedule of the reference recipe."""

    lr: float = 5e-5
    weight_decay: float = 0.05
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    eps: float = 1e-8
    clip_grad: float = 1.0
    lr_warmup_steps: int = 500
    total_training_steps: int = 5000
    min_lr_rate: float = 0.0

    def validate(self, root: str = "actor.optim") -> None:
        require(self.lr > 0, f"{root}.lr", f"must be > 0, got {self.lr}")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{root}.betas",
                f"must be two numbers in [0, 1), got {self.betas}")
        require(self.clip_grad > 0, f"{root}.clip_grad", f"must be > 0, got {self.clip_grad}")
        require(0 <= self.lr_warmup_steps < self.total_training_steps, f"{root}.lr_warmup_steps",
                f"must be in [0, total_training_steps={self.total_training_steps}), got {self.lr_warmup_steps}")
        require(0.0 <= self.min_lr_rate <= 1.0, f"{root}.min_lr_rate", f"must be in [0, 1], got {self.min_lr_rate}")


@dataclass
class ActorConfig:
    """``actor``: per-rank batch shape, model and optimiser."""

    micro_batch_size: int = 32
    global_batch_size: int = 2048
    max_tokens_per_pack: int | None = DEFAULT_MAX_TOKENS_PER_PACK
    """The samples of a micro-batch share one transformer call up to this many tokens (a longer
    micro-batch is split into several packs; cosmos-framework packs up to 74,000); null: one call per
    sample (the reference path)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def validate(self, world: int) -> None:
        """The batch geometry over ``world`` ranks (global = micro x world x accumulation), packing, model, optim."""
        require(self.micro_batch_size >= 1, "actor.micro_batch_size", f"must be >= 1, got {self.micro_batch_size}",
                "set it to the samples one rank processes per forward/backward, e.g. actor.micro_batch_size=1")
        per_step = self.micro_batch_size * world
        require(
            self.global_batch_size % per_step == 0,
            "actor.global_batch_size",
            f"{self.global_batch_size} is not a multiple of micro_batch_size x world_size = "
            f"{self.micro_batch_size} x {world} = {per_step}",
            f"use a multiple of {per_step}, e.g. "
            f"actor.global_batch_size={max(per_step, self.global_batch_size // per_step * per_step)}",
        )
        require(self.max_tokens_per_pack is None or self.max_tokens_per_pack >= 1, "actor.max_tokens_per_pack",
                f"must be >= 1 or null, got {self.max_tokens_per_pack}",
                "use e.g. 74000 (the recipe), or null for one transformer call per sample")
        self.model.validate("actor.model")
        self.optim.validate("actor.optim")


ONLINE_EVAL_FORCED = ("rollout.rollout_backend", "rollout.model.model_path", "rollout.model.action_stats_path",
                      "runner.logs_dir", "runner.resume_dir")
"""Eval fields the online evaluation sets itself (runners/online_eval_job.py): an override of one is refused."""


@dataclass
class OnlineEvalConfig:
    """``runner.online_eval``: what the evaluation every ``runner.eval_interval`` steps runs.

    Each evaluation converts the checkpoint just saved and runs the named eval config from
    ``evaluations/libero/`` with the embedded backend in a process of its own, while training goes on;
    its success rates land in this run's TensorBoard as ``eval/*`` at the step evaluated.
    """

    config_name: str = "libero_spatial_cosmos3_eval_sglang"
    """An eval config in ``evaluations/libero/`` (the reference eval by default)."""
    overrides: list[str] = field(default_factory=list)
    """Hydra overrides of that eval config: keep the set small and fixed, e.g.
    ``[env.eval.task_ids=[0,1],env.eval.init_state_ids=[0,1,2]]``."""
    use_ema: bool = True
    """Evaluate the EMA weights (when ``actor.model.ema_enabled``; else the trained ones)."""
    timeout_s: float = 3600.0
    """An evaluation running longer is stopped (and reported as failed); training is never stopped."""
    keep_models: bool = False
    """Keep each converted model directory (one transformer's size on disk each); false deletes it
    once its evaluation ends."""


@dataclass
class RunnerConfig:
    """``runner``: how long, where the outputs go, how often to log and save."""

    experiment_name: str = "libero_sft_cosmos3"
    logs_dir: str = "logs"
    """Where the run directory ``<logs_dir>/<timestamp>-<config>/`` (log, TensorBoard, config) goes."""
    log_path: str = "logs"
    """Root for checkpoints: ``<log_path>/<experiment_name>/checkpoints/global_step_<N>/``."""
    max_steps: int = 5000
    save_interval: int = 500
    log_interval: int = 10
    resume_dir: str | None = None
    """A ``.../checkpoints/global_step_<N>`` directory to continue from exactly."""
    max_checkpoints_to_keep: int | None = None
    """Keep only the newest K complete checkpoints of this run's checkpoint directory: after each
    successful save the older ones are deleted (the ``resume_dir`` checkpoint never is). None keeps
    all: deleting is irreversible and which intermediate steps matter (to evaluate, to restart from)
    is the user's call; the start-up check warns when the checkpoints the run will keep do not fit."""
    seed: int = 42
    max_wall_time_s: float | None = None
    """Stop cleanly once training has run this long (seconds from the first step): the step in progress
    finishes, a checkpoint is saved and the run exits 0, naming the checkpoint to resume from (a batch
    scheduler's time limit then costs nothing). None: no limit. The LR schedule is not shortened."""
    eval_interval: int | None = None
    """Evaluate in LIBERO every this many steps (a multiple of ``save_interval``: the checkpoint saved
    at that step is what is evaluated; see ``online_eval``). None: no evaluation during training."""
    online_eval: OnlineEvalConfig = field(default_factory=OnlineEvalConfig)

    def validate(self) -> None:
        """Lengths and intervals; the online evaluation's schedule and eval config name when it is on."""
        require(self.max_steps >= 1, "runner.max_steps", f"must be >= 1, got {self.max_steps}")
        require(self.save_interval >= 1, "runner.save_interval", f"must be >= 1, got {self.save_interval}")
        require(self.log_interval >= 1, "runner.log_interval", f"must be >= 1, got {self.log_interval}")
        require(self.max_wall_time_s is None or self.max_wall_time_s > 0, "runner.max_wall_time_s",
                f"must be > 0 or null, got {self.max_wall_time_s}",
                "give the run's time limit in seconds (it stops with a checkpoint), or null for none")
        keep = self.max_checkpoints_to_keep
        require(keep is None or keep >= 1, "runner.max_checkpoints_to_keep",
                f"must be >= 1 or null (keep all), got {keep}",
                "set it to the number of newest checkpoints to keep, e.g. runner.max_checkpoints_to_keep=2")
        if self.eval_interval is not None:
            check_online_eval(self)


@dataclass
class DataLoaderConfig:
    """``data``: the LIBERO dataset reader plus DataLoader settings."""

    dataset: LiberoDataConfig = field(default_factory=LiberoDataConfig)
    num_workers: int = 4
    """DataLoader processes per rank decoding video (the recipe's 4); 0 decodes in the rank itself."""
    prefetch_factor: int = 4
    """Batches each loader process prepares ahead (the recipe's 4; unused with ``num_workers=0``)."""
    latent_cache_dir: str | None = None
    """Frozen-VAE latents of every training sample, computed once (first run) and reused by later
    steps and runs: no video decoding and no VAE per step. A cache made from another dataset, VAE,
    canvas or reader setting is rejected (use a new directory). null: decode and encode every step."""


@dataclass
class SFTConfig:
    """The whole SFT run."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    data: DataLoaderConfig = field(default_factory=DataLoaderConfig)

    def validate(self) -> SFTConfig:
        """Every section's values, and the reader's model settings against the run's; raises :class:`ConfigError`
        on the first. What is on disk is :mod:`rlinf_cosmos3.validation.sft`'s."""
        self.cluster.validate("cluster")
        self.actor.validate(self.cluster.world_size)
        self.runner.validate()
        check_dataset_values(self)
        return self


SFT_SETTING_KEYS = {
    "fps": "actor.model.fps", "action_horizon": "actor.model.action_horizon", "num_frames": "actor.model.num_frames",
    "canvas_height": "actor.model.canvas_height", "canvas_width": "actor.model.canvas_width",
    "normalization": "actor.model.action_normalization", "domain_name": "actor.model.domain_name",
    "caption_style": "actor.model.caption_style", "gripper_convention": "data.dataset.gripper_convention",
}
"""Model setting -> the SFT config key that sets it. ``view_point`` is not one: the policy composes its
canvas for the recipe's framing. ``data.dataset`` states fps, horizon, frames and normalisation again for
its reader (``DATA_SETTING_KEYS``); :func:`check_dataset_values` requires them equal to these."""


def sft_model_settings(cfg: SFTConfig) -> ModelSettings:
    """The model settings an SFT run trains with (and writes into its checkpoints' identity)."""
    return read_settings(cfg, SFT_SETTING_KEYS)


def check_dataset_values(cfg: SFTConfig) -> None:
    """``data``: the reader's own value checks, and the model settings it states again must be the run's."""
    data = cfg.data.dataset
    try:
        data.validate()
    except ConfigError as err:  # the reader's own schema reports fields relative to its section
        raise ConfigError(err.field.replace("data.", "data.dataset.", 1), err.problem, err.fix) from err
    require(cfg.data.num_workers >= 0, "data.num_workers", f"must be >= 0, got {cfg.data.num_workers}",
            "use 0 (decode in the rank's own process) or the number of loader processes per rank")
    # The model settings the reader states again must be the run's.
    trained, read = sft_model_settings(cfg), read_settings(data, DATA_SETTING_KEYS)
    for name, key in DATA_SETTING_KEYS.items():
        require(getattr(read, name) == getattr(trained, name), f"data.dataset.{key}",
                f"{getattr(read, name)!r} disagrees with the model setting {getattr(trained, name)!r}",
                "training and evaluation must use the same value: make them equal")


def check_online_eval(runner: RunnerConfig) -> None:
    """The schedule and the eval config's name; the eval config itself is checked by the driver."""
    interval, online = runner.eval_interval, runner.online_eval
    require(interval is not None and interval >= 1, "runner.eval_interval", f"must be >= 1 or null, got {interval}")
    require(interval % runner.save_interval == 0, "runner.eval_interval",
            f"{interval} is not a multiple of runner.save_interval={runner.save_interval}: each evaluation "
            "converts the checkpoint saved at its step",
            f"use a multiple of {runner.save_interval}, e.g. runner.eval_interval={runner.save_interval}")
    configs = REPO_ROOT / "evaluations" / "libero"
    have = sorted(p.stem for p in configs.glob("*.yaml"))
    require(online.config_name in have, "runner.online_eval.config_name",
            f"no eval config '{online.config_name}' in {configs}", f"use one of {have}")
    require(online.timeout_s > 0, "runner.online_eval.timeout_s", f"must be > 0, got {online.timeout_s}")
    for override in online.overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        require(key not in ONLINE_EVAL_FORCED, "runner.online_eval.overrides",
                f"'{override}': {key} is set by the online evaluation itself (embedded backend, the converted "
                "checkpoint, this run's stats file, a directory inside this run)", f"drop '{override}'")


HYDRA_SCHEMA = "sft_schema"
"""Name of :class:`SFTConfig` in Hydra's config store: the first entry of an SFT YAML's ``defaults``, so
every field of the schema can be set from the command line and an unknown key is an error."""


def register_hydra_schema() -> None:
    """Put :class:`SFTConfig` into Hydra's config store (idempotent; done when this module is imported)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=HYDRA_SCHEMA, node=SFTConfig)


register_hydra_schema()
