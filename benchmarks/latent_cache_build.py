"""How fast the SFT latent cache is built, and where the time goes.

    PYTHONPATH=$PWD python benchmarks/latent_cache_build.py --data data/small4 --stats data/small4_stats.json \\
        --model /tmp/cosmos3_small --device cuda --samples 200 --workers 0,8 --vae-batch 8,32 --out build.json

The learning proof spends ~220 s of its 462 s training phase building the cache of 5,864 samples
(~27 samples/s on an H200 host); this splits that rate into its parts, each measured with the
library's own functions in one process (torch intra-op threads = ``--cpu-threads``, 8 = the recipe's
``cluster.cpus_per_rank``, as Ray gives the SFT worker):

- ``reader``: the training reader (``LiberoLeRobotDataset``, video decoding) through a DataLoader of
  ``--workers`` processes, batches of 8, ``collate_samples`` - samples/s with nothing else running;
- ``canvas_reader``: what the build reads before the VAE, through a DataLoader of ``--workers`` processes:
  ``CanvasSamples`` sample by sample (``by_sample``) and ``CanvasEpisodes`` episode by episode
  (``by_episode``, over the whole episodes of ``by_episode_samples``) - samples/s;
- ``canvas``: ``PolicyProcessor.canvases`` (the [main | wrist] composition, bicubic antialiased) on
  one batch, in this process - ms per sample;
- ``vae``: ``PolicyProcessor.encode_canvases`` (the frozen VAE through the diffusers pipeline's
  helpers) per ``--vae-batch`` - ms per sample, synchronised;
- ``build``: ``latent_cache.build_cache`` with ``PolicyProcessor.encode_pixels`` (what the worker
  passes), for every (workers, VAE batch) pair - samples/s end to end, the cache deleted after -
  three ways: the canvas composed in this process from the reader's views (``canvas_here``), by the
  loader's workers through ``CanvasSamples`` (``canvas_in_workers``, sample by sample), and episode by
  episode through ``CanvasEpisodes`` (``by_episode``, what the SFT worker does: each stored frame decoded
  and composed once; over the first whole episodes that hold at least ``--samples`` samples).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset

from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset, latent_cache
from rlinf_cosmos3.data.collate import collate_samples
from rlinf_cosmos3.models.cosmos3.canvas_samples import CanvasEpisodes, CanvasSamples
from rlinf_cosmos3.models.cosmos3.configuration import sft_vae_dtype
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
from rlinf_cosmos3.models.cosmos3.processor import PolicyProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the scripts' shared _common
from _common import device_name, write_json  # noqa: E402

READER_BATCH = 8


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reader_rate(reader: Any, samples: int, workers: int) -> float:
    """Samples/s of the reader alone through a DataLoader, counted from the first batch's arrival (the
    workers' start excluded) when there is more than one batch."""
    loader = DataLoader(Subset(reader, range(samples)), batch_size=READER_BATCH, num_workers=workers,
                        collate_fn=collate_samples)
    t0 = time.perf_counter()
    arrivals = []
    for batch in loader:
        arrivals.append((time.perf_counter(), len(batch["prompt"])))
    if len(arrivals) > 1:
        return sum(n for _, n in arrivals[1:]) / (arrivals[-1][0] - arrivals[0][0])
    return arrivals[0][1] / (arrivals[0][0] - t0)


def episode_reader_rate(episodes: CanvasEpisodes, workers: int) -> float:
    """Samples/s of whole episodes read and composed (``CanvasEpisodes``) through a DataLoader of ``workers``."""
    loader = DataLoader(episodes, batch_size=None, num_workers=workers, collate_fn=latent_cache.keep_as_read)
    t0 = time.perf_counter()
    count = sum(len(episode.positions) for episode in loader)
    return count / (time.perf_counter() - t0)


def processor_with(policy: Cosmos3Policy, vae_batch: int) -> PolicyProcessor:
    """The policy's processor with another ``vae_batch_size`` (the same pipeline and settings)."""
    cfg = dataclasses.replace(policy.cfg, vae_batch_size=vae_batch)
    return PolicyProcessor(policy.pipeline, cfg, policy.domain.raw_action_dim)


def timed(fn: Any, device: torch.device, repeats: int = 3) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def build_rate(source: Any, processor: PolicyProcessor, samples: int, workers: int, work: Path,
               episodes: CanvasEpisodes | None = None) -> float:
    """Samples/s of ``latent_cache.build_cache`` over the first ``samples`` samples, or over all of ``source``
    read by ``episodes`` (the cache then deleted)."""
    cache = work / f"cache_w{workers}_b{processor.cfg.vae_batch_size}"
    source = source if episodes is not None else Subset(source, range(samples))
    t0 = time.perf_counter()
    latent_cache.build_cache(source, processor.encode_pixels, cache, {"benchmark": 1},
                             batch_size=processor.cfg.vae_batch_size, num_workers=workers, episodes=episodes)
    elapsed = time.perf_counter() - t0
    shutil.rmtree(cache)
    return len(source) / elapsed


def whole_episodes(data_cfg: LiberoDataConfig, reader: LiberoLeRobotDataset, samples: int) -> LiberoLeRobotDataset:
    """The reader over its first episodes that hold at least ``samples`` samples (all of them if fewer)."""
    kept, count = [], 0
    for episode in reader.sample_episodes():
        kept.append(episode)
        count += len(reader.episode_positions(episode))
        if count >= samples:
            break
    return LiberoLeRobotDataset(dataclasses.replace(data_cfg, episodes=kept))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a LeRobot v3 dataset (record_demos.py)")
    parser.add_argument("--stats", required=True, help="its action stats (compute_action_stats.py)")
    parser.add_argument("--model", required=True, help="a Cosmos3 diffusers directory (make_tiny_model.py)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--workers", type=_ints, default=[0, 8], help="DataLoader workers to try, e.g. 0,8")
    parser.add_argument("--vae-batch", type=_ints, default=[8, 32], help="vae_batch_size values, e.g. 8,32")
    parser.add_argument("--cpu-threads", type=int, default=8, help="torch intra-op threads (the worker's 8)")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(args.cpu_threads, os.cpu_count() or 1)))
    device = torch.device(args.device)
    data_cfg = LiberoDataConfig(root=args.data, stats_path=args.stats, complete_chunks_only=False)
    reader = LiberoLeRobotDataset(data_cfg)
    samples = min(args.samples, len(reader))
    policy = Cosmos3Policy.from_pretrained(args.model, device=device, vae_dtype=sft_vae_dtype(device.type == "cuda"))
    doc: dict[str, Any] = {"device": device_name(device),
                           "host_cores": os.cpu_count(), "cpu_threads": torch.get_num_threads(), "samples": samples,
                           "vae_dtype": str(policy.vae.dtype), "reader": {}, "canvas": {}, "vae": {}, "build": {}}

    for workers in args.workers:
        doc["reader"][f"workers_{workers}"] = rate = reader_rate(reader, samples, workers)
        print(f"reader, {workers} workers: {rate:.1f} samples/s", flush=True)
    episode_reader = whole_episodes(data_cfg, reader, samples)
    doc["by_episode_samples"] = len(episode_reader)
    doc["canvas_reader"] = {}
    for workers in args.workers:  # side by side: the same samples, read both ways
        by_sample = reader_rate(CanvasSamples(episode_reader, policy.cfg), len(episode_reader), workers)
        by_episode = episode_reader_rate(CanvasEpisodes(episode_reader, policy.cfg), workers)
        doc["canvas_reader"][f"workers_{workers}"] = {"by_sample": by_sample, "by_episode": by_episode}
        print(f"canvas reader, {workers} workers: {by_sample:.1f} samples/s by sample, {by_episode:.1f} by episode "
              f"({by_episode / by_sample:.1f}x)", flush=True)
    batch = collate_samples([reader[i] for i in range(max(args.vae_batch))])
    for size in args.vae_batch:
        processor = processor_with(policy, size)
        part = {k: (v[:size] if hasattr(v, "__getitem__") else v) for k, v in batch.items()}
        canvases = processor.canvases(part)
        doc["canvas"][f"batch_{size}"] = ms = 1000 * timed(lambda p=processor, b=part: p.canvases(b), device) / size
        print(f"canvas, batch {size}: {ms:.1f} ms/sample", flush=True)
        on_device = canvases.to(device)
        doc["vae"][f"batch_{size}"] = ms = 1000 * timed(lambda p=processor, c=on_device: p.encode_canvases(c),
                                                        device) / size
        print(f"vae, batch {size}: {ms:.1f} ms/sample", flush=True)
    sources = {"canvas_here": (reader, None), "canvas_in_workers": (CanvasSamples(reader, policy.cfg), None),
               "by_episode": (CanvasSamples(episode_reader, policy.cfg), CanvasEpisodes(episode_reader, policy.cfg))}
    with tempfile.TemporaryDirectory(prefix="latent_cache_bench_") as work:
        for workers in args.workers:
            for size in args.vae_batch:
                for name, (source, episodes) in sources.items():  # side by side, alternating
                    rate = build_rate(source, processor_with(policy, size), samples, workers, Path(work), episodes)
                    doc["build"][f"{name}_workers_{workers}_vae_batch_{size}"] = rate
                    print(f"build, {name}, {workers} workers, VAE batch {size}: {rate:.1f} samples/s", flush=True)
    if args.out:
        write_json(args.out, doc, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
