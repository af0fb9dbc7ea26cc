"""One rank of Cosmos3 SFT: FSDP2-sharded policy, AdamW, schedule, EMA, data stream, checkpoints.

The policy, optimizer, schedule and EMA come from :mod:`rlinf_cosmos3.components.sft_trainer` (also
what the step benchmark builds): the transformer is built on the meta device, sharded, then materialised
shard by shard while rank 0 streams the weights in. The frozen VAE is a small per-rank replica.

The optimizer step itself is :func:`rlinf_cosmos3.components.train_step.train_step` (also what the
benchmarks time); its noise depends only on ``(seed, global step, dataset index)``, so resuming, or
splitting the same global batch over a different number of ranks, draws the same noise. With
``data.latent_cache_dir`` the frozen VAE runs once per sample (cache built on first use, by all ranks),
and steps read latents instead of decoding videos.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from rlinf_cosmos3.checkpoint import load_checkpoint, save_checkpoint
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.cluster import Worker
from rlinf_cosmos3.components.sft_trainer import build_sft_optimization, build_sft_policy
from rlinf_cosmos3.components.train_step import sample_generators, train_step
from rlinf_cosmos3.config.sft import SFTConfig
from rlinf_cosmos3.data import LiberoLeRobotDataset, collate_samples, latent_cache
from rlinf_cosmos3.data.sampler import ResumableDistributedSampler
from rlinf_cosmos3.data.stream import BatchStream
from rlinf_cosmos3.models.cosmos3.canvas_samples import CanvasEpisodes, CanvasSamples
from rlinf_cosmos3.models.cosmos3.configuration import sft_latent_cache_key
from rlinf_cosmos3.validation.sft import load_sft_config

__all__ = ["FSDPSFTWorker", "sample_generators"]


class FSDPSFTWorker(Worker):
    """A Ray actor rank; the runner calls :meth:`setup`, then :meth:`train_step` and :meth:`save_checkpoint`."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        # The driver validated the config; re-validating here (without GPU probing) gives each rank
        # the same typed view and fails early if a path is not visible from this node.
        self.cfg: SFTConfig = load_sft_config(cfg, check_gpus=False)
        self.global_step = 0
        self.consumed_samples = 0

    # ------------------------------------------------------------------ set-up

    def setup(self, resume_dir: str | None = None) -> dict[str, Any]:
        """Build data, model, optimizer, schedule and EMA; optionally resume. Returns a summary."""
        cfg = self.cfg
        torch.manual_seed(cfg.runner.seed + self.rank)

        self.dataset: Dataset = LiberoLeRobotDataset(cfg.data.dataset)
        self.sampler = ResumableDistributedSampler(
            len(self.dataset), self.rank, self.world_size, seed=cfg.runner.seed
        )
        self.grad_accum_steps = cfg.actor.global_batch_size // (cfg.actor.micro_batch_size * self.world_size)
        self._stream: BatchStream | None = None

        self.policy, selection = build_sft_policy(cfg, self.device, self.world_size)
        transformer = self.policy.transformer
        # The loader's workers compose each sample's canvas (in parallel, half the bytes to move).
        reader = self.dataset
        self.dataset = CanvasSamples(reader, self.policy.cfg)
        if cfg.data.latent_cache_dir:
            self.dataset = self._latent_dataset(self.dataset, CanvasEpisodes(reader, self.policy.cfg))
        optimization = build_sft_optimization(transformer, cfg)
        self.optimizer, self.scheduler, self.ema = optimization.optimizer, optimization.scheduler, optimization.ema

        if resume_dir:
            state = load_checkpoint(resume_dir, transformer, self.optimizer, self.scheduler, self.ema)
            self.global_step = state.global_step
            self.consumed_samples = state.consumed_samples
            self.sampler.load_position(state.sampler_state)
            self.logger.info("resumed at step %d, data position %s", self.global_step, state.sampler_state)
        return {
            "global_step": self.global_step,
            "trainable_params": selection.n_trainable,
            "total_params": selection.n_trainable + selection.n_frozen,
            "num_samples": len(self.dataset),
            "grad_accum_steps": self.grad_accum_steps,
        }

    def _latent_dataset(self, source: Dataset, episodes: CanvasEpisodes) -> latent_cache.LatentCacheDataset:
        """The latent cache of ``source`` (built now, by all ranks, if the directory holds none, reading
        ``episodes``: the same samples, each stored frame decoded and composed once)."""
        cfg, vae = self.cfg, self.policy.vae
        key = sft_latent_cache_key(cfg, on_gpu=self.device.type == "cuda")
        cache_dir = Path(cfg.data.latent_cache_dir)
        if not latent_cache.check_cache(cache_dir, key):
            self.logger.info("building the latent cache %s (%d samples over %d ranks)", cache_dir, len(source),
                             self.world_size)

            def encode(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
                latents, valid = self.policy.processor.encode_pixels(batch)
                return latents.to(vae.dtype), valid  # the VAE's own precision: exact, half the bytes in bf16

            latent_cache.build_cache(
                source, encode, cache_dir, key, rank=self.rank, world_size=self.world_size,
                barrier=dist.barrier if dist.is_initialized() else (lambda: None),
                batch_size=self.policy.cfg.vae_batch_size, num_workers=cfg.data.num_workers, progress=True,
                episodes=episodes,
            )
        dataset = latent_cache.LatentCacheDataset(cache_dir)
        if len(dataset) != len(source):
            raise RuntimeError(f"latent cache {cache_dir} holds {len(dataset)} samples, the reader {len(source)}")
        return dataset

    def _next_batch(self) -> dict[str, Any]:
        """The next micro-batch of this rank's stream (:class:`BatchStream`: epochs rolled over, the
        position advanced); the stream is made at the first call, after a resume has set the position."""
        if self._stream is None:
            workers = self.cfg.data.num_workers
            self._stream = BatchStream(
                self.dataset, self.sampler, self.cfg.actor.micro_batch_size, num_workers=workers,
                prefetch_factor=self.cfg.data.prefetch_factor, collate_fn=collate_samples,
                pin_memory=self.device.type == "cuda", rank=self.rank,
            )
        return next(self._stream)

    # ------------------------------------------------------------------ training

    def train_step(self) -> dict[str, float]:
        """One optimizer step over ``grad_accum_steps`` micro-batches; metrics averaged over ranks."""
        optim_cfg = self.cfg.actor.optim
        synchronize = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        result = train_step(
            self.policy, self.optimizer, self._next_batch,
            grad_accum_steps=self.grad_accum_steps, seed=self.cfg.runner.seed, global_step=self.global_step,
            clip_grad=optim_cfg.clip_grad, scheduler=self.scheduler, ema=self.ema, synchronize=synchronize,
        )
        self.global_step += 1
        self.consumed_samples += self.cfg.actor.global_batch_size
        return {
            **result.metrics(),
            "rank_step_time_s": result.forward_backward_s + result.optimizer_s,
            "forward_backward_s": result.forward_backward_s,
            "optimizer_s": result.optimizer_s,
            "peak_memory_gb": self._peak_memory_gb(),
        }

    def _peak_memory_gb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (peak RSS)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, step_dir: str, extra_files: dict[str, str] | None = None) -> str:
        """Collective: write ``step_dir`` (``.../global_step_<N>``) atomically, ``extra_files`` at its root."""
        step_dir_path = Path(step_dir)
        expected = f"global_step_{self.global_step}"
        if step_dir_path.name != expected:
            raise ValueError(
                f"asked to save step {self.global_step} into '{step_dir}', expected a '{expected}' dir"
            )
        state = TrainerState(
            global_step=self.global_step,
            epoch=self.sampler.position.epoch,
            sample_offset=self.sampler.position.offset * self.world_size,
            consumed_samples=self.consumed_samples,
            sampler_state=self.sampler.position.to_dict(),
        )
        path = save_checkpoint(
            step_dir_path.parent, self.policy.transformer, self.optimizer, state, self.scheduler, self.ema,
            extra_files=extra_files,
        )
        return str(path)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The consolidated transformer weights (collective; for tests and small models)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.policy.transformer, options=options)
