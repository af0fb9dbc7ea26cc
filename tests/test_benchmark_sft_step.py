"""``benchmarks/gpu/sft_step.py``: its CPU path end to end, its variant grammar, its memory model, and that
its timed step is the SFT worker's (the library's ``train_step`` on the recipe's optimizer, schedule, EMA).

The CPU run goes through the real step (tiny preset, one gloo rank, FSDP2, ``Cosmos3Policy`` loss on
cached-latent batches in the reader's layout) and must report every measured figure as a positive
finite number, with a token count that matches the policy task's sequence layout, for a per-sample
and a packed variant side by side.
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
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "sft_step.py"
CONFIG_DIR = REPO / "examples" / "sft" / "config"
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
CACHED_BATCH_KEYS = [  # what LatentCacheDataset serves (rlinf_cosmos3.data.latent_cache), collated
    "action_is_pad", "actions", "episode_index", "frame_index", "frame_is_pad", "index", "prompt", "state",
    "vision_frame_valid", "x0_vision",
]


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


def test_cpu_run_reports_packed_and_per_sample_side_by_side(tmp_path: Path) -> None:
    from rlinf_cosmos3.config.sft import DEFAULT_MAX_TOKENS_PER_PACK

    out = tmp_path / "sft_step.json"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--steps", "2", "--warmup", "1",
           "--variants", "base+nopack,fused+pack+mb2", "--out", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
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
    assert layout["samples_per_step"] == 2 and layout["tokens_per_step"] == 2 * per_sample
    assert layout["batch_keys"] == CACHED_BATCH_KEYS and not layout["with_encode"]  # data.latent_cache_dir's

    flops = report["flops"]
    assert flops["source"] == "FlopCounterMode"
    assert flops["per_step"] == flops["per_sample"] * layout["samples_per_step"] > 0
    assert any("scaled_dot_product" in op for op in flops["by_op_per_sample"])  # attention is counted
    assert _positive_finite(report["matmul"]["flops_per_s"])
    assert _positive_finite(report["encode_s_per_sample"])
    # the worker's intra-op threads: Ray's OMP_NUM_THREADS = the recipe's cluster.cpus_per_rank (8), at most the cores
    assert report["device"]["cpu_threads"] == min(8, os.cpu_count() or 1)

    variants = report["variants"]
    assert [(v["name"], v["features"], v["status"]) for v in variants] == [
        ("base+nopack", "foreach+nopack+mb1", "ok"),
        ("fused+pack+mb2", "fused+pack+mb2", "ok"),
    ]
    for v in variants:
        for key in MEASURED:
            assert _positive_finite(v[key]), (v["name"], key, v[key])
        assert len(v["step_times_s"]) == 2 and v["loss_finite"]
        assert v["tokens_per_step"] == layout["tokens_per_step"]
        assert v["tokens_per_s"] == pytest.approx(layout["tokens_per_step"] / v["step_time_s"])
        assert v["samples_per_s"] == pytest.approx(2 / v["step_time_s"])
        assert v["mfu"] == pytest.approx(flops["per_step"] / v["step_time_s"] / report["matmul"]["flops_per_s"])

    # Per sample: two micro-batches of one sample, one call each; packed: one micro-batch, one call of both.
    nopack, pack = variants
    assert (nopack["micro_batch"], nopack["grad_accum"], nopack["max_tokens_per_pack"]) == (1, 2, None)
    assert (nopack["transformer_calls_per_step"], nopack["tokens_per_call"]) == (2, [per_sample])
    assert (pack["micro_batch"], pack["grad_accum"], pack["max_tokens_per_pack"]) == (2, 1, DEFAULT_MAX_TOKENS_PER_PACK)
    assert (pack["transformer_calls_per_step"], pack["tokens_per_call"]) == (1, [2 * per_sample])
    # Same weights, samples and noise seeds: the first step's loss is the same whichever way it is packed.
    assert pack["losses"][0] == pytest.approx(nopack["losses"][0], rel=1e-5)

    table = proc.stdout.strip().splitlines()
    assert table[-1] == f"json: {out}"
    assert any(line.startswith("base+nopack ") for line in table)
    assert any(line.startswith("fused+pack+mb2 ") for line in table)


def test_benchmark_step_is_the_workers_step(bench: ModuleType, tmp_path: Path) -> None:
    """The recipe's variant (``ac``, packed, EMA) timed by the benchmark == the worker's calls on the recipe.

    The reference side composes the recipe itself, builds the policy, optimizer, schedule and EMA with the
    library calls ``FSDPSFTWorker.setup`` makes (``build_sft_policy`` on the benchmark's weights directory,
    ``build_sft_optimization``), then calls ``train_step`` as ``FSDPSFTWorker.train_step`` does; both
    start from the same weights on disk and the same micro-batches. Equal losses, gradient norms, learning
    rates, AdamW moments and EMA shadows after two steps mean the benchmark times the worker's step.
    """
    from hydra import compose, initialize_config_dir

    from rlinf_cosmos3.components.sft_trainer import build_sft_optimization, build_sft_policy
    from rlinf_cosmos3.components.train_step import train_step
    from rlinf_cosmos3.config.base import load_structured
    from rlinf_cosmos3.config.sft import SFTConfig

    args = bench.parse_args(["--device", "cpu", "--preset", "tiny", "--variants", "base+ac+ema+pack+mb2",
                             "--global-batch", "4", "--seed", "3"])
    with bench.one_rank_process_group("cpu"):  # the benchmark's own (benchmarks/_common.py)
        setup = bench.prepare(args, torch.device("cpu"), args.variant_list, tmp_path)
        timed = bench.build(setup, args.variant_list[0])
        ours = [bench.timed_step(setup, timed, step) for step in range(2)]

        overrides = [f"actor.model.model_path={setup.model_dir}", "data.dataset.root=x", "data.dataset.stats_path=x",
                     "actor.micro_batch_size=2", "actor.global_batch_size=4", "runner.seed=3"]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = load_structured(SFTConfig, compose(config_name="libero_sft_cosmos3", overrides=overrides))
        model_cfg = cfg.actor.model
        policy, _ = build_sft_policy(cfg, torch.device("cpu"), world_size=1)
        transformer = policy.transformer
        optimization = build_sft_optimization(transformer, cfg)
        optimizer, scheduler, ema = optimization.optimizer, optimization.scheduler, optimization.ema
        batches = bench.micro_batches(setup, cfg.actor.micro_batch_size)
        stream = iter(batches + batches)
        accum = cfg.actor.global_batch_size // cfg.actor.micro_batch_size  # one rank, as the worker divides
        theirs = [
            train_step(policy, optimizer, stream.__next__, grad_accum_steps=accum, seed=cfg.runner.seed,
                       global_step=step, clip_grad=cfg.actor.optim.clip_grad, scheduler=scheduler, ema=ema)
            for step in range(2)
        ]

    assert [b["index"].tolist() for b in batches] == [[0, 1], [2, 3]]
    assert sorted(batches[0]) == CACHED_BATCH_KEYS
    assert model_cfg.activation_checkpointing and model_cfg.ema_enabled and cfg.actor.max_tokens_per_pack
    assert timed.policy.transformer.is_gradient_checkpointing and transformer.is_gradient_checkpointing
    for a, b in zip(ours, theirs, strict=True):
        assert (a.loss, a.vision_loss, a.action_loss, a.grad_norm, a.lr) == (
            b.loss, b.vision_loss, b.action_loss, b.grad_norm, b.lr)
    assert [g["lr"] for g in timed.optimizer.param_groups] == [g["lr"] for g in optimizer.param_groups]
    assert len(timed.optimizer.param_groups) == 2  # the action heads' 5x group
    for p, q in zip(timed.policy.transformer.parameters(), transformer.parameters(), strict=True):
        assert torch.equal(p, q)
        if p.requires_grad:
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(timed.optimizer.state[p][key], optimizer.state[q][key])
    assert timed.ema.shadow.keys() == ema.shadow.keys()
    assert all(torch.equal(timed.ema.shadow[k], ema.shadow[k]) for k in ema.shadow)


def test_variant_grammar(bench: ModuleType) -> None:
    from rlinf_cosmos3.config.sft import DEFAULT_MAX_TOKENS_PER_PACK

    assert bench.parse_variant("base").features == "foreach+pack+mb1"
    assert bench.parse_variant("ac", micro_batch=4).features == "fused+ac+pack+mb4"
    assert bench.parse_variant("base+ac+noreshard").features == "foreach+ac+noreshard+pack+mb1"
    per_sample = bench.parse_variant("compile+noreshard+nopack+mb16", micro_batch=4)
    assert per_sample.features == "fused+compile+noreshard+nopack+mb16"
    assert (per_sample.micro_batch, per_sample.max_tokens_per_pack) == (16, None)
    assert bench.parse_variant("pack").max_tokens_per_pack == DEFAULT_MAX_TOKENS_PER_PACK
    assert bench.parse_variant("pack1000+mb8").features == "fused+pack1000+mb8"
    assert bench.parse_variant("pack1000+mb8").samples_per_call(424) == 2
    assert bench.parse_variant("prefetch").prefetch == 2 and bench.parse_variant("prefetch3").prefetch == 3
    for bad, message in (("base+fused", "sets optimizer twice"), ("pack+nopack", "sets max_tokens_per_pack twice"),
                         ("mb4+mb8", "sets micro_batch twice"), ("fsdp3", "unknown variant part"),
                         ("mb", "unknown variant part"), ("mb0", ">= 1"), ("compile+ac", "compile_blocks")):
        with pytest.raises(ValueError, match=message):
            bench.parse_variant(bad)
    with pytest.raises(ValueError, match="--global-batch 24 is not a multiple"):
        bench.parse_variants("pack+mb16", micro_batch=4, global_batch=24)

    # The default run answers the issue: packed and per-sample side by side at micro-batches 4, 16 and 32.
    defaults = bench.parse_variants(bench.DEFAULT_VARIANTS, micro_batch=4, global_batch=32)
    assert [v.name for v in defaults] == bench.DEFAULT_VARIANTS.split(",")
    assert {(v.micro_batch, v.max_tokens_per_pack is None) for v in defaults} == {
        (mb, per) for mb in (4, 16, 32) for per in (True, False)
    }


def test_variant_is_the_recipe_plus_its_overrides(bench: ModuleType, tmp_path: Path) -> None:
    from rlinf_cosmos3.models.cosmos3.configuration import policy_config_from_sft

    recipe = bench.recipe_config(tmp_path, seed=5, trainable="recipe")  # paths are not validated
    assert (recipe.actor.model.activation_checkpointing, recipe.actor.max_tokens_per_pack) == (True, 74_000)
    assert (recipe.runner.seed, recipe.actor.model.model_path) == (5, str(tmp_path))

    variant = bench.parse_variant("compile+noreshard+nopack+mb4")
    cfg = bench.recipe_config(tmp_path, 5, "all", variant.overrides(global_batch=32))
    assert (cfg.actor.micro_batch_size, cfg.actor.global_batch_size, cfg.actor.max_tokens_per_pack) == (4, 32, None)
    model = cfg.actor.model
    assert (model.activation_checkpointing, model.compile_blocks, model.reshard_after_forward) == (False, True, False)
    assert not model.ema_enabled and model.keys_to_select is None  # --trainable all
    assert model.lr_multipliers == recipe.actor.model.lr_multipliers and cfg.actor.optim == recipe.actor.optim
    assert policy_config_from_sft(cfg, precision="bf16").max_tokens_per_pack is None


def test_memory_model_and_nano_default_layers(bench: ModuleType, tmp_path: Path) -> None:
    """The documented default (22 of 36 Nano layers) is the memory model's answer for the default variants,
    and the model accounts for each variant's micro-batch (32 samples fit only with checkpointing)."""
    from rlinf_cosmos3.models.cosmos3.tiny import get_preset, random_vae, write_model_dir

    model_dir = write_model_dir(tmp_path / "nano", preset="nano")
    vae = random_vae(get_preset("nano").vae, device="meta")
    keys = bench.recipe_config(model_dir, 0, "recipe").actor.model.keys_to_select
    counts = bench.count_model(model_dir, keys, vae)
    assert (counts.layer_params, counts.layer_trainable) == (385_892_864, 192_946_432)
    assert counts.total(36) == 15_173_136_576 and counts.config_layers == 36
    layout = bench.Layout(108, 300, 240, 16)
    target = bench.DEFAULT_MEMORY_TARGET_GIB * bench.GIB
    defaults = bench.parse_variants(bench.DEFAULT_VARIANTS, micro_batch=4, global_batch=32)
    assert bench.auto_layers(counts, layout, defaults, target, 2, 2) == bench.NANO_DEFAULT_LAYERS
    checkpointed = bench.auto_layers(counts, layout, bench.parse_variants("ac", 4, 32), target, 2, 2)
    assert bench.NANO_DEFAULT_LAYERS < checkpointed < 36

    def peak(name: str) -> float:
        return bench.estimate_peak_bytes(counts, 22, layout, bench.parse_variant(name), 2, 2)

    assert peak("pack+mb4") < peak("pack+mb16") < peak("pack+mb32")
    assert peak("ac+pack+mb32") < target < peak("pack+mb32")
    assert peak("ac+nopack+mb32") < peak("ac+pack+mb32")  # one layer of the whole pack is recomputed at once
    assert peak("pack+mb16") == peak("nopack+mb16")  # without checkpointing packing keeps the same activations

    # The figures docs/benchmarks.md ("The SFT step's memory model") gives, in GiB.
    def gib(name: str, layers: int = 22) -> float:
        return round(bench.estimate_peak_bytes(counts, layers, layout, bench.parse_variant(name), 2, 2) / bench.GIB, 1)

    assert [gib(v) for v in ("compile+noreshard+nopack+mb4", "compile+noreshard+pack+mb4", "pack+mb16", "nopack+mb16",
                             "pack+mb32", "ac+nopack+mb32", "ac+pack+mb32")] == [114.4, 114.4, 124.9, 124.9, 158.2, 95.7, 98.5]
    assert gib("ac+pack+mb4", layers=36) == 143.0
    assert (counts.root_params, counts.root_trainable) == (1_280_993_472, 36_329_664)


def test_weights_dir_cuts_layers_and_writes_loadable_weights(bench: ModuleType, tmp_path: Path) -> None:
    """A directory of the asked depth is used as it is; another depth gets a copy with random weights that
    the worker's loader accepts (the key sets must match its config exactly)."""
    from rlinf_cosmos3.models.cosmos3 import loading
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

    model_dir = write_model_dir(tmp_path / "tiny", preset="tiny")
    layers = json.loads((model_dir / "transformer" / "config.json").read_text())["num_hidden_layers"]
    assert bench.weights_dir(model_dir, layers, tmp_path, torch.device("cpu"), 0) == model_dir

    cut = bench.weights_dir(model_dir, 1, tmp_path, torch.device("cpu"), 0)
    assert cut != model_dir and json.loads((cut / "transformer" / "config.json").read_text())["num_hidden_layers"] == 1
    transformer = loading.build_transformer_on_meta(cut)
    loading.load_transformer_weights(transformer, cut, device="cpu")
    assert len(transformer.layers) == 1 and not any(p.is_meta for p in transformer.parameters())
