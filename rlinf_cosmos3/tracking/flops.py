"""FLOP counts and the device's matmul rate: what the MFU figures of ``benchmarks/gpu/`` are computed from.

Both the SFT-step and the serving benchmark divide counted FLOPs by the measured rate of one large
``torch.matmul``; one definition of each keeps their MFU figures comparable.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

_SDPA_FORWARD = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


def measure_matmul(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, size: int = 8192, reps: int = 10,
                   warmup: int = 3) -> dict[str, Any]:
    """Median rate of a ``size``^3 ``torch.matmul`` on random data after ``warmup`` calls: the MFU denominator
    (CUDA events on a GPU, wall time elsewhere)."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    times = []
    for i in range(warmup + reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            torch.matmul(a, b)
            elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
    del a, b
    median = statistics.median(times)
    rate = 2.0 * size**3 / median
    return {"size": size, "dtype": str(dtype).removeprefix("torch."), "median_s": median, "times_s": times,
            "flops_per_s": rate, "tflops": rate / 1e12}


def _expand_kv(query_shape: Sequence[int], kv_shape: Sequence[int]) -> tuple[int, ...]:
    """GQA: count attention as if the key/value heads were repeated to the query heads."""
    b, _, s, d = kv_shape
    return (b, query_shape[1], s, d)


def _sdpa_forward_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, _expand_kv(query_shape, key_shape), _expand_kv(query_shape, value_shape))


def _sdpa_backward_flops(grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                         **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out_shape, query_shape, _expand_kv(query_shape, key_shape),
                                    _expand_kv(query_shape, value_shape))


def attention_flop_formulas() -> dict[Any, Callable[..., int]]:
    """``FlopCounterMode(custom_mapping=...)`` for every SDPA kernel this torch has, forward and backward.

    FlopCounterMode's own SDPA formulas reject GQA (8 key/value heads vs 32 query heads) and do not know
    the CPU flash kernel; these count both (QK^T and PV, and their gradients)."""
    aten = torch.ops.aten
    out: dict[Any, Callable[..., int]] = {}
    for name in _SDPA_FORWARD:
        if hasattr(aten, name):
            out[getattr(aten, name)] = _sdpa_forward_flops
        if hasattr(aten, name + "_backward"):
            out[getattr(aten, name + "_backward")] = _sdpa_backward_flops
    return out
