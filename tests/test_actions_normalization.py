"""quantile_rot normalisation: formula by hand, the 1e-8 floor, exact inverse, ActionNormalizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlinf_cosmos3.actions import (
    ActionNormalizer,
    ActionStatsError,
    quantile_denormalize,
    quantile_normalize,
    write_action_stats,
)


def test_normalize_worked_by_hand() -> None:
    q01, q99 = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 4.0, 6.0])
    # ch0: 2(0+1)/2-1 = 0 ; ch1: 2(1-0)/4-1 = -0.5 ; ch2: 2(7-2)/4-1 = 1.5 (no clipping)
    np.testing.assert_allclose(quantile_normalize(np.array([0.0, 1.0, 7.0]), q01, q99), [0.0, -0.5, 1.5])
    np.testing.assert_allclose(quantile_normalize(q01, q01, q99), [-1.0, -1.0, -1.0])
    np.testing.assert_allclose(quantile_normalize(q99, q01, q99), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(quantile_denormalize(np.array([0.0, -0.5, 1.5]), q01, q99), [0.0, 1.0, 7.0])


def test_range_floor_is_1e_minus_8() -> None:
    q01 = np.array([2.0, 0.0, 0.0])
    q99 = np.array([2.0, 1e-9, 2e-8])  # range 0 and 1e-9 are floored to 1e-8; 2e-8 is not
    a = np.array([2.0 + 1e-8, 1e-8, 2e-8])
    # (2 + 1e-8 is not exact in binary, hence rtol 1e-6; without the floor channel 0 would be inf.)
    np.testing.assert_allclose(quantile_normalize(a, q01, q99), [1.0, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(quantile_normalize(q01, q01, q99), [-1.0, -1.0, -1.0])
    # The inverse uses the same floored range, so it is exact even on a constant channel.
    np.testing.assert_allclose(quantile_denormalize(np.array([1.0, 1.0, 1.0]), q01, q99), a, rtol=1e-15)


@settings(max_examples=200, deadline=None)
@given(
    a=hnp.arrays(np.float64, (5, 4), elements=st.floats(-5, 5)),
    q01=hnp.arrays(np.float64, 4, elements=st.floats(-2, 2)),
    span=hnp.arrays(np.float64, 4, elements=st.one_of(st.just(0.0), st.floats(1e-10, 3))),
)
def test_normalize_denormalize_round_trip(a: np.ndarray, q01: np.ndarray, span: np.ndarray) -> None:
    q99 = q01 + span
    back = quantile_denormalize(quantile_normalize(a, q01, q99), q01, q99)
    np.testing.assert_allclose(back, a, rtol=1e-9, atol=1e-9)
    x = np.clip(a, -1.5, 1.5)
    np.testing.assert_allclose(quantile_normalize(quantile_denormalize(x, q01, q99), q01, q99), x, atol=1e-6)


def _stats(raw_q01: list[float], raw_q99: list[float]) -> dict:
    block = {k: [0.0] * 10 for k in ("mean", "std", "min", "max")}
    glob = dict(block, q01=[-5.0] * 10, q99=[5.0] * 10)  # deliberately different from global_raw
    return {
        "metadata": {"chunk_length": 16},
        "global": glob,
        "global_raw": dict(block, q01=raw_q01, q99=raw_q99),
    }


def test_action_normalizer_reads_global_raw(tmp_path) -> None:
    q01 = [-0.5, -0.5, -1.0, 0.9, -0.2, -0.2, -0.3, 0.9, -0.1, 0.0]
    q99 = [0.5, 0.5, 1.0, 1.0, 0.3, 0.2, 0.2, 1.0, 0.1, 1.0]
    path = write_action_stats(_stats(q01, q99), tmp_path / "s.json")
    for source in (path, str(path), _stats(q01, q99)):
        norm = ActionNormalizer(source, method="quantile_rot")
        np.testing.assert_allclose(
            norm.normalize(np.array([q01, q99])), [[-1.0] * 10, [1.0] * 10], atol=1e-12
        )
        a = np.array([0.25, 0.0, 0.5, 0.95, 0.05, 0.0, -0.05, 0.95, 0.0, 0.5])
        # worked: ch0 2(0.75)/1-1 = 0.5 ; ch2 2(1.5)/2-1 = 0.5 ; ch9 2(0.5)/1-1 = 0
        n = norm.normalize(a)
        assert n[0] == pytest.approx(0.5) and n[2] == pytest.approx(0.5) and n[9] == pytest.approx(0.0)
        np.testing.assert_allclose(norm.denormalize(n), a, atol=1e-12)
    assert norm.metadata == {"chunk_length": 16}


def test_action_normalizer_dtypes_batches_and_torch() -> None:
    norm = ActionNormalizer(_stats([0.0] * 10, [2.0] * 10))
    a = np.ones((3, 16, 10), dtype=np.float32)
    out = norm.normalize(a)
    assert out.dtype == np.float32 and out.shape == (3, 16, 10)
    np.testing.assert_array_equal(out, np.zeros_like(a))
    t = torch.full((2, 16, 10), 2.0, dtype=torch.bfloat16)
    tn = norm.normalize(t)
    assert isinstance(tn, torch.Tensor) and tn.dtype == torch.bfloat16
    assert torch.equal(tn, torch.ones_like(t))
    assert torch.equal(norm.denormalize(tn), t)


def test_action_normalizer_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="supported: quantile_rot"):
        ActionNormalizer(_stats([0.0] * 10, [1.0] * 10), method="quantile")
    with pytest.raises(ValueError, match=r"expected actions \[\.\.\., 10\]"):
        ActionNormalizer(_stats([0.0] * 10, [1.0] * 10)).normalize(np.zeros((16, 7)))
    bad = _stats([0.0] * 10, [1.0] * 9)
    with pytest.raises(ActionStatsError, match=r"global_raw\.q99"):
        ActionNormalizer(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        ActionNormalizer(tmp_path / "missing.json")
