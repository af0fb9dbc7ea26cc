"""Frozen-VAE latents computed once per (dataset, VAE, canvas) and reused by later steps and runs.

Decoding 17 frames of two videos and running the frozen VAE costs far more than a small model's
training step, and gives the same numbers every epoch. The cache stores, for every training sample
of the reader (same order, same length), what the loss needs instead of pixels: the clean latents,
the latent-frame validity, and the reader's non-pixel fields (normalised actions, masks, state,
idle-frame count, prompt, indexes). :class:`LatentCacheDataset` then serves samples with no video decoding and no VAE.

A cache directory records what it was made from (:func:`cache_key`: the dataset's files, the reader
settings, the stats file, the VAE's weights and dtype, the canvas). Opening it for anything else is an
error that names the difference, never a silent reuse. Layout::

    <latent_cache_dir>/
      manifest.json              key, sample count, shapes, dtypes, tasks; written last (complete or absent)
      shard_<r>/                 rows of rank r's share (whole episodes when built by episode): position.npy
                                 (each row's sample), index.npy, x0_vision.npy (raw bf16/fp32 bits),
                                 vision_frame_valid.npy, actions.npy, action_is_pad.npy, frame_is_pad.npy,
                                 state.npy, idle_frames.npy, task.npy, episode_index.npy, frame_index.npy
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from rlinf_cosmos3.config.base import ConfigError
from rlinf_cosmos3.config.data import LiberoDataConfig
from rlinf_cosmos3.data.collate import collate_samples
from rlinf_cosmos3.data.episode_reader import EpisodeSamples

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""2: samples carry ``idle_frames`` (the caption of the ``cosmos_framework`` style needs it)."""
MANIFEST = "manifest.json"
LATENT_KEY = "x0_vision"
"""Batch key of precomputed VAE latents (``[B, C, T_latent, h, w]``): the cache writes it, the policy's
processor reads it and skips the VAE."""
LATENT_VALID_KEY = "vision_frame_valid"
"""Batch key of the latent frames' validity (``[B, T_latent]`` bool) beside :data:`LATENT_KEY`."""
POSITION_KEY = "position"
"""Shard array of each row's sample position in the reader."""
_FIELDS = ("actions", "action_is_pad", "frame_is_pad", "state", "idle_frames", "episode_index", "frame_index")
_DTYPES = {"bfloat16": (torch.bfloat16, np.uint16), "float32": (torch.float32, np.float32),
           "float16": (torch.float16, np.float16)}

EncodeFn = Callable[[Mapping[str, Any]], tuple[torch.Tensor, torch.Tensor]]
"""A batch of reader samples -> (clean latents ``[B, C, T, h, w]``, latent-frame validity ``[B, T]``)."""


class EpisodeSource(Protocol):
    """The samples of a dataset grouped by episode: item ``i`` reads episode ``i`` whole (pixels under the keys
    the encoder reads), ``positions(i)`` says which dataset samples it holds without reading it."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> EpisodeSamples: ...

    def positions(self, i: int) -> np.ndarray: ...


class LatentCacheMismatch(ConfigError):
    """The cache directory was made from other inputs than this run's."""


# ----------------------------------------------------------------------------------- the key


def _sha256_file(path: Path, limit: int | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if limit is None:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        else:  # large media: size + head + tail identify the file well enough, cheaply
            size = path.stat().st_size
            digest.update(str(size).encode())
            digest.update(fh.read(limit))
            fh.seek(max(0, size - limit))
            digest.update(fh.read(limit))
    return digest.hexdigest()


def _tree_digest(root: Path, parts: Iterable[str], media_suffixes: tuple[str, ...] = (".mp4",)) -> str:
    """One hash over every file under ``root/<part>`` (relative path + content; media by head/tail)."""
    digest = hashlib.sha256()
    for part in parts:
        base = root / part
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base]
        for path in files:
            if not path.exists():
                continue
            limit = 1 << 16 if path.suffix in media_suffixes else None
            digest.update(str(path.relative_to(root)).encode())
            digest.update(_sha256_file(path, limit).encode())
    return digest.hexdigest()


def cache_key(
    data: LiberoDataConfig, model_dir: str | Path, *, vae_dtype: str, canvas: tuple[int, int], resolution_tier: int
) -> dict[str, Any]:
    """Everything the cached values depend on, as plain JSON values."""
    root = Path(data.root).expanduser()
    vae_dir = Path(model_dir).expanduser() / "vae"
    reader = asdict(data)
    reader.pop("root")
    reader.pop("repo_id")
    reader["stats_path"] = _sha256_file(Path(data.stats_path).expanduser())
    return {
        "format_version": FORMAT_VERSION,
        "dataset": _tree_digest(root, ("meta", "data", "videos", "images")),
        "reader": reader,
        "vae": _tree_digest(vae_dir, ("",), media_suffixes=()),
        "vae_dtype": vae_dtype,
        "canvas": list(canvas),
        "resolution_tier": resolution_tier,
    }


def _differences(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    names = {"dataset": "the dataset's files", "reader": "the reader settings (data.dataset.*)",
             "vae": "the VAE weights", "vae_dtype": "the VAE dtype", "canvas": "the canvas size",
             "resolution_tier": "the resolution tier", "format_version": "the cache format"}
    out = []
    for key in sorted(set(found) | set(wanted)):
        if found.get(key) != wanted.get(key):
            if key == "reader":
                fields = sorted(k for k in set(found.get(key, {})) | set(wanted.get(key, {}))
                                if found.get(key, {}).get(k) != wanted.get(key, {}).get(k))
                out.append(f"{names[key]}: {', '.join(fields)}")
            else:
                out.append(names.get(key, key))
    return out


def read_manifest(cache_dir: str | Path) -> dict[str, Any] | None:
    path = Path(cache_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def check_cache(cache_dir: str | Path, key: Mapping[str, Any], field: str = "data.latent_cache_dir") -> bool:
    """True if ``cache_dir`` holds a complete cache made from ``key``; False if it holds none yet.

    Raises :class:`LatentCacheMismatch` when it holds a cache made from anything else.
    """
    cache_dir = Path(cache_dir).expanduser()
    manifest = read_manifest(cache_dir)
    if manifest is None:
        leftovers = [p for p in cache_dir.iterdir() if not p.name.startswith(".")] if cache_dir.is_dir() else []
        if leftovers:
            raise LatentCacheMismatch(field, f"'{cache_dir}' is not empty and holds no latent cache manifest "
                                      f"({leftovers[0].name}, ...)", "point it at an empty or new directory")
        return False
    diffs = _differences(manifest.get("key", {}), key)
    if diffs:
        raise LatentCacheMismatch(
            field, f"the latent cache in '{cache_dir}' was made from other inputs: {'; '.join(diffs)} differ",
            "use another directory for this run (or delete that cache to rebuild it)")
    return True


# ----------------------------------------------------------------------------------- build


def _rank_share(num_samples: int, rank: int, world: int) -> list[int]:
    return list(range(rank, num_samples, world))


def build_cache(
    dataset: Dataset,
    encode: EncodeFn,
    cache_dir: str | Path,
    key: Mapping[str, Any],
    *,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    batch_size: int = 16,
    num_workers: int = 0,
    progress: bool = False,
    episodes: EpisodeSource | None = None,
) -> Path:
    """Encode this rank's share of ``dataset`` into ``cache_dir`` (collective over ranks; rank 0 publishes).

    With ``episodes`` (the same samples read episode by episode, :class:`EpisodeSource`) each rank encodes
    whole episodes (``episodes[rank::world_size]``), every stored frame decoded once; without (or with fewer
    episodes than ranks), it reads ``dataset[rank::world_size]`` sample by sample. Either way each row records its sample's position.
    Shards are written under a temporary directory next to ``cache_dir`` and renamed in place with
    the manifest last, so an interrupted build leaves no cache that could be mistaken for complete.
    """
    cache_dir = Path(cache_dir).expanduser()
    if len(dataset) < world_size:
        raise ValueError(f"{len(dataset)} samples cannot be shared by {world_size} ranks")
    if episodes is not None and len(episodes) < world_size:
        logger.info("latent cache: %d episodes for %d ranks: read sample by sample", len(episodes), world_size)
        episodes = None
    staging = cache_dir.parent / f".{cache_dir.name}.building"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier()
    t0 = time.perf_counter()
    out = staging / f"shard_{rank:05d}"
    show = progress and rank == 0
    if episodes is None:
        count, shard = _encode_samples(dataset, encode, _rank_share(len(dataset), rank, world_size), out,
                                       batch_size, num_workers, show)
    else:
        count, shard = _encode_episodes(episodes, encode, _rank_share(len(episodes), rank, world_size), out,
                                        batch_size, num_workers, show)
    logger.info("latent cache: rank %d encoded %d samples in %.1f s%s", rank, count, time.perf_counter() - t0,
                " (read by episode)" if episodes is not None else "")
    barrier()
    if rank == 0:
        manifest = {"key": dict(key), "num_samples": len(dataset), "world_size": world_size, **shard,
                    "created_at": datetime.datetime.now().isoformat()}
        cache_dir.mkdir(parents=True, exist_ok=True)
        for part in sorted(staging.iterdir()):
            target = cache_dir / part.name
            if target.exists():
                shutil.rmtree(target)
            os.rename(part, target)
        tmp = cache_dir / f".{MANIFEST}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.rename(tmp, cache_dir / MANIFEST)
        shutil.rmtree(staging, ignore_errors=True)
        logger.info("latent cache ready: %s (%d samples)", cache_dir, len(dataset))
    barrier()
    return cache_dir


class _ShardWriter:
    """One rank's rows as .npy memmaps (opened at the first batch, ``rows`` long)."""

    def __init__(self, out: Path, rows: int) -> None:
        out.mkdir(parents=True)
        self.out, self.rows, self.row = out, rows, 0
        self.arrays: dict[str, np.memmap] = {}
        self.task_ids: dict[str, int] = {}
        self.meta: dict[str, Any] = {}

    def write(self, batch: Mapping[str, Any], positions: np.ndarray, latents: torch.Tensor,
              valid: torch.Tensor) -> None:
        n = latents.shape[0]
        values = {
            POSITION_KEY: np.asarray(positions, dtype=np.int64),
            "index": batch["index"].numpy(),
            LATENT_KEY: _to_numpy(latents),
            LATENT_VALID_KEY: valid.cpu().numpy().astype(bool),
            **{f: batch[f].numpy() for f in _FIELDS},
        }
        for prompt in batch["prompt"]:
            self.task_ids.setdefault(prompt, len(self.task_ids))
        values["task"] = np.array([self.task_ids[p] for p in batch["prompt"]], dtype=np.int32)
        if not self.arrays:
            self.meta = {"latent_dtype": str(latents.dtype).removeprefix("torch."),
                         "latent_shape": list(latents.shape[1:])}
            for name, value in values.items():
                self.arrays[name] = np.lib.format.open_memmap(self.out / f"{name}.npy", mode="w+",
                                                              dtype=value.dtype, shape=(self.rows, *value.shape[1:]))
        for name, value in values.items():
            self.arrays[name][self.row : self.row + n] = value
        self.row += n

    def close(self) -> dict[str, Any]:
        if self.row != self.rows:
            raise RuntimeError(f"latent cache shard {self.out}: wrote {self.row} rows, expected {self.rows}")
        for array in self.arrays.values():
            array.flush()
        (self.out / "tasks.json").write_text(json.dumps(list(self.task_ids)))
        return self.meta


def _encode_samples(
    dataset: Dataset, encode: EncodeFn, indexes: list[int], out: Path, batch_size: int, num_workers: int,
    progress: bool,
) -> tuple[int, dict[str, Any]]:
    """Write the rows of ``dataset[indexes]``, read sample by sample; returns (rows, manifest fields)."""
    from tqdm import tqdm

    writer = _ShardWriter(out, len(indexes))
    loader = DataLoader(torch.utils.data.Subset(dataset, indexes), batch_size=batch_size,
                        num_workers=num_workers, collate_fn=collate_samples, shuffle=False)
    with tqdm(total=len(indexes), desc="latent cache", unit="sample", disable=not progress,
              dynamic_ncols=True) as bar:
        for start, batch in zip(range(0, len(indexes), batch_size), loader, strict=True):
            latents, valid = encode(batch)
            writer.write(batch, np.asarray(indexes[start : start + latents.shape[0]]), latents, valid)
            bar.update(latents.shape[0])
    return len(indexes), writer.close()


def _encode_episodes(
    episodes: EpisodeSource, encode: EncodeFn, items: list[int], out: Path, batch_size: int, num_workers: int,
    progress: bool,
) -> tuple[int, dict[str, Any]]:
    """Write the rows of the samples of ``episodes[items]``, each episode read once (in the loader's workers)
    and its samples' windows encoded ``batch_size`` at a time; returns (rows, manifest fields)."""
    from tqdm import tqdm

    rows = sum(len(episodes.positions(i)) for i in items)
    writer = _ShardWriter(out, rows)
    loader = DataLoader(torch.utils.data.Subset(episodes, items), batch_size=None, num_workers=num_workers,
                        collate_fn=keep_as_read, shuffle=False)
    with tqdm(total=rows, desc="latent cache", unit="sample", disable=not progress, dynamic_ncols=True) as bar:
        for episode in loader:
            for start in range(0, len(episode.positions), batch_size):
                chunk = slice(start, start + batch_size)
                batch = collate_samples(episode.samples[chunk])
                batch.update({name: frames[episode.windows[chunk]] for name, frames in episode.frames.items()})
                latents, valid = encode(batch)
                writer.write(batch, episode.positions[chunk], latents, valid)
                bar.update(latents.shape[0])
    return rows, writer.close()


def keep_as_read(item: Any) -> Any:
    """A DataLoader's collate for whole episodes (``batch_size=None``): the item as the dataset made it."""
    return item


def _to_numpy(latents: torch.Tensor) -> np.ndarray:
    latents = latents.detach().cpu().contiguous()
    if latents.dtype == torch.bfloat16:
        return latents.view(torch.uint16).numpy()
    return latents.numpy()


# ----------------------------------------------------------------------------------- read


class LatentCacheDataset(Dataset):
    """Training samples from a latent cache: the reader's samples with latents instead of pixels."""

    def __init__(self, cache_dir: str | Path) -> None:
        self.cache_dir = Path(cache_dir).expanduser()
        manifest = read_manifest(self.cache_dir)
        if manifest is None:
            raise FileNotFoundError(f"no latent cache at '{self.cache_dir}' (no {MANIFEST})")
        self.num_samples = int(manifest["num_samples"])
        self.latent_dtype, self._raw_dtype = _DTYPES[manifest["latent_dtype"]]
        self._shards: list[dict[str, np.ndarray]] = []
        self._tasks: list[list[str]] = []
        self._where = np.full((self.num_samples, 2), -1, dtype=np.int64)
        for s, shard in enumerate(sorted(self.cache_dir.glob("shard_*"))):
            arrays = {p.stem: np.load(p, mmap_mode="r") for p in shard.glob("*.npy")}
            self._shards.append(arrays)
            self._tasks.append(json.loads((shard / "tasks.json").read_text()))
            rows = len(arrays[LATENT_KEY])
            positions = (np.asarray(arrays[POSITION_KEY]) if POSITION_KEY in arrays  # caches before 2026-12-07: none
                         else _rank_share(self.num_samples, s, int(manifest["world_size"])))
            if len(positions) != rows:
                raise ValueError(f"latent cache shard {shard} holds {rows} rows, expected {len(positions)}")
            self._where[positions] = np.stack([np.full(rows, s), np.arange(rows)], axis=1)
        if (self._where < 0).any():
            raise ValueError(f"latent cache '{self.cache_dir}' is incomplete: samples without a row")

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if not 0 <= idx < self.num_samples:
            raise IndexError(f"sample {idx} out of range for {self.num_samples} samples")
        s, r = (int(v) for v in self._where[idx])
        shard = self._shards[s]
        latents = torch.from_numpy(np.array(shard[LATENT_KEY][r]))
        if self.latent_dtype == torch.bfloat16:
            latents = latents.view(torch.bfloat16)
        sample: dict[str, Any] = {
            LATENT_KEY: latents,
            LATENT_VALID_KEY: torch.from_numpy(np.array(shard[LATENT_VALID_KEY][r])),
            "prompt": self._tasks[s][int(shard["task"][r])],
            "index": torch.tensor(int(shard["index"][r]), dtype=torch.int64),
        }
        for name in _FIELDS:
            sample[name] = torch.from_numpy(np.array(shard[name][r]))
        return sample
