"""``benchmarks/gpu/sft_step.py``: its CPU path end to end, its variant grammar and its memory model.

The CPU run goes through the real step (tiny preset, one gloo rank, FSDP2, ``Cosmos3Policy`` loss
on the reader's layout) and must report every measured figure as a positive finite number, with a
token count that matches the policy task's sequence layout.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "sft_step.py"
MEASURED = (
    "step_time_s",
    "fwd_bwd_s",
    "optimizer_s",
    "tokens_per_s",
    "samples_per_s",
    "flops_per_step",
    "achieved_flops_per_s",
    "mfu",
    "peak_memory_gib",
    "estimated_peak_gib",
)


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sft_step", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sft_step"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load_script()


def _positive_finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_cpu_run_reports_every_measured_figure(tmp_path: Path) -> None:
    out = tmp_path / "sft_step.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--variants",
        "base,fused",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())

    # The policy task's sequence: 17 frames -> 1 + 16/4 = 5 latent frames of (192/16/2) x (320/16/2)
    # = 6 x 10 patches, frame 0 clean; 16 action tokens; the chat-templated caption as text.
    layout = report["layout"]
    assert layout["vision_tokens"] == 5 * 6 * 10
    assert layout["noisy_vision_tokens"] == 4 * 6 * 10
    assert layout["action_tokens"] == 16
    assert layout["text_tokens"] > 0
    per_sample = layout["text_tokens"] + layout["vision_tokens"] + layout["action_tokens"]
    assert layout["tokens_per_sample"] == per_sample
    assert report["flops"]["transformer_call"]["sequence_length"] == per_sample  # what the transformer saw
    assert (layout["micro_batch"], layout["grad_accum"]) == (1, 2)
    assert layout["tokens_per_step"] == per_sample * layout["micro_batch"] * layout["grad_accum"]

    flops = report["flops"]
    assert flops["source"] == "FlopCounterMode"
    assert flops["per_step"] == flops["per_sample"] * layout["samples_per_step"] > 0
    assert any("scaled_dot_product" in op for op in flops["by_op_per_sample"])  # attention is counted
    assert _positive_finite(report["matmul"]["flops_per_s"])
    assert _positive_finite(report["encode_s_per_sample"])

    variants = report["variants"]
    assert [(v["name"], v["features"], v["status"]) for v in variants] == [
        ("base", "foreach", "ok"),
        ("fused", "fused", "ok"),
    ]
    for v in variants:
        for key in MEASURED:
            assert _positive_finite(v[key]), (v["name"], key, v[key])
        assert len(v["step_times_s"]) == 2 and v["loss_finite"]
        assert v["tokens_per_step"] == layout["tokens_per_step"]
        assert v["tokens_per_s"] == pytest.approx(layout["tokens_per_step"] / v["step_time_s"])
        assert v["mfu"] == pytest.approx(
            flops["per_step"] / v["step_time_s"] / report["matmul"]["flops_per_s"]
        )

    table = proc.stdout.strip().splitlines()
    assert table[-1] == f"json: {out}"
    assert any(line.startswith("base ") for line in table) and any(
        line.startswith("fused ") for line in table
    )


def test_variant_grammar(bench: ModuleType) -> None:
    assert bench.parse_variant("base").features == "foreach"
    assert bench.parse_variant("ac").features == "fused+ac"
    assert bench.parse_variant("base+ac+noreshard").features == "foreach+ac+noreshard"
    assert bench.parse_variant("compile+noreshard").features == "fused+compile+noreshard"
    assert bench.parse_variant("prefetch").prefetch == 2 and bench.parse_variant("prefetch3").prefetch == 3
    assert [v.name for v in bench.parse_variants(bench.DEFAULT_VARIANTS)] == bench.DEFAULT_VARIANTS.split(",")
    with pytest.raises(ValueError, match="two optimizers"):
        bench.parse_variant("base+fused")
    with pytest.raises(ValueError, match="unknown variant part"):
        bench.parse_variant("fsdp3")


def test_nano_default_layers_is_what_auto_picks(bench: ModuleType, tmp_path: Path) -> None:
    """The documented default (22 of 36 Nano layers) is the memory model's answer for the defaults."""
    from rlinf_cosmos3.models.cosmos3.tiny import get_preset, random_vae, write_model_dir

    model_dir = write_model_dir(tmp_path / "nano", preset="nano")
    vae = random_vae(get_preset("nano").vae, device="meta")
    counts = bench.count_model(model_dir, "recipe", bench.load_recipe().keys_to_select, vae)
    assert (counts.layer_params, counts.layer_trainable) == (385_892_864, 192_946_432)
    assert counts.total(36) == 15_173_136_576 and counts.config_layers == 36
    layout = bench.Layout(108, 300, 240, 16, micro_batch=4, grad_accum=4)  # the GPU defaults
    variants = bench.parse_variants(bench.DEFAULT_VARIANTS)
    target = bench.DEFAULT_MEMORY_TARGET_GIB * bench.GIB
    assert bench.auto_layers(counts, layout, variants, target, 2, 2) == bench.NANO_DEFAULT_LAYERS
    checkpointed = bench.auto_layers(counts, layout, bench.parse_variants("ac"), target, 2, 2)
    assert bench.NANO_DEFAULT_LAYERS < checkpointed < 36
