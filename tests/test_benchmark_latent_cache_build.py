"""``benchmarks/latent_cache_build.py`` on CPU: every part it reports is measured through the library
(a real LeRobot dataset, the tiny Cosmos3, ``build_cache`` sample by sample with the canvas composed both
ways, and episode by episode) and
written as positive rates."""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from dataset_helpers import write_libero_like

REPO = Path(__file__).resolve().parent.parent


def test_latent_cache_build_benchmark_reports_every_part(tiny_model_and_stats, tmp_path, monkeypatch) -> None:
    scratch = tmp_path / "scratch"  # the benchmark's own temporary root, so other runs' leftovers in /tmp don't count
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    data = write_libero_like(tmp_path / "data", length=10)
    spec = importlib.util.spec_from_file_location("latent_cache_build_bench", REPO / "benchmarks/latent_cache_build.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "build.json"
    assert bench.main(["--data", str(data), "--stats", str(tiny_model_and_stats.stats),
                       "--model", str(tiny_model_and_stats.model), "--device", "cpu", "--samples", "6",
                       "--workers", "0", "--vae-batch", "3", "--cpu-threads", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["samples"] == 6 and doc["vae_dtype"] == "torch.float32"
    rates = [doc["reader"]["workers_0"], doc["canvas"]["batch_3"], doc["vae"]["batch_3"],
             doc["build"]["canvas_here_workers_0_vae_batch_3"], doc["build"]["canvas_in_workers_workers_0_vae_batch_3"],
             doc["build"]["by_episode_workers_0_vae_batch_3"]]
    assert doc["by_episode_samples"] >= 6
    assert doc["canvas_reader"]["workers_0"]["by_sample"] > 0 and doc["canvas_reader"]["workers_0"]["by_episode"] > 0
    assert all(rate > 0 for rate in rates), doc
    assert bench.tempfile.gettempdir() == str(scratch)
    assert not list(scratch.glob("latent_cache_bench_*"))  # the caches were deleted
