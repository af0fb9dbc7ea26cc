"""Stats JSON schema, atomic writing, and the chunk statistics against a brute-force recomputation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlinf_cosmos3.actions import (
    STAT_FIELDS,
    STATS_FILENAME,
    ActionStatsError,
    actions_7_to_10,
    compute_action_stats,
    load_action_stats,
    write_action_stats,
)
from rlinf_cosmos3.actions.stats import select_chunks, weighted_quantile


def _valid() -> dict:
    block = {k: [float(i) / 10 for i in range(10)] for k in STAT_FIELDS}
    return {"metadata": {"chunk_length": 16}, "global": dict(block), "global_raw": dict(block)}


def brute_force_block(episodes: list[np.ndarray], chunks: np.ndarray, chunk_length: int) -> dict:
    """Stack every selected chunk as the training loader would see it, then take plain numpy stats."""
    rows = np.concatenate([actions_7_to_10(episodes[e][s : s + chunk_length]) for e, s in chunks])
    return {
        "mean": rows.mean(axis=0),
        # The reference's Welford accumulator reports std 0 for a single row (numpy would give NaN).
        "std": rows.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(rows.shape[1]),
        "min": rows.min(axis=0),
        "max": rows.max(axis=0),
        "q01": np.quantile(rows, 0.01, axis=0),
        "q99": np.quantile(rows, 0.99, axis=0),
    }


def test_file_name_and_fields() -> None:
    assert STATS_FILENAME == "libero_native_frame_wise_relative_rot6d.json"
    assert STAT_FIELDS == ("mean", "std", "min", "max", "q01", "q99")


# ---------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.pop("metadata"), "missing top-level field 'metadata'"),
        (lambda s: s.pop("global_raw"), "missing top-level field 'global_raw'"),
        (lambda s: s["global"].pop("q99"), r"'global\.q99' is missing"),
        (
            lambda s: s["global_raw"].__setitem__("std", [1.0] * 9),
            r"'global_raw\.std' has 9 values, expected 10",
        ),
        (
            lambda s: s["global_raw"].__setitem__("mean", [0.0] * 9 + ["x"]),
            r"'global_raw\.mean' must hold finite",
        ),
        (lambda s: s["global"].__setitem__("min", [0.0] * 9 + [math.nan]), r"'global\.min' must hold finite"),
        (lambda s: s["global"].__setitem__("max", "0123456789"), r"'global\.max' must be a list"),
        (lambda s: s.__setitem__("metadata", []), "'metadata' must be an object"),
    ],
)
def test_schema_errors_name_the_field_and_the_file(tmp_path, mutate, message: str) -> None:
    stats = json.loads(json.dumps(_valid()))
    mutate(stats)
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats))
    with pytest.raises(ActionStatsError, match=message) as info:
        load_action_stats(path)
    assert str(path) in str(info.value)


def test_missing_and_malformed_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_action_stats(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ActionStatsError, match="not valid JSON"):
        load_action_stats(bad)


def test_write_is_atomic_and_validated(tmp_path) -> None:
    path = tmp_path / "sub" / STATS_FILENAME
    write_action_stats(_valid(), path)
    assert load_action_stats(path) == _valid()
    before = path.read_text()
    broken = _valid()
    broken["global_raw"]["q01"] = [0.0] * 3
    with pytest.raises(ActionStatsError, match=r"global_raw\.q01"):
        write_action_stats(broken, path)
    assert path.read_text() == before  # the good file is untouched
    assert sorted(p.name for p in path.parent.iterdir()) == [STATS_FILENAME]  # no temp files left


# ---------------------------------------------------------------- computation


def test_stats_worked_by_hand() -> None:
    # One episode of 4 frames, chunk_length 2: chunks start at t = 0, 1 (each needs t..t+2 frames),
    # so the rows are frames 0,1,1,2 and frame 3 (x = 100) never enters.
    ep = np.zeros((4, 7))
    ep[:, 0] = [0.0, 1.0, 2.0, 100.0]
    ep[:, 6] = [1.0, 1.0, 0.0, 0.0]
    stats = compute_action_stats([ep], chunk_length=2)
    raw = stats["global_raw"]
    assert raw["mean"][0] == pytest.approx(1.0)
    assert raw["std"][0] == pytest.approx(math.sqrt(2 / 3))  # sample std of 0,1,1,2
    assert (raw["min"][0], raw["max"][0]) == (0.0, 2.0)
    assert raw["q01"][0] == pytest.approx(0.03)  # position 0.03 between 0 and 1
    assert raw["q99"][0] == pytest.approx(1.97)  # position 2.97 between 1 and 2
    assert raw["mean"][9] == pytest.approx(0.75)  # gripper rows 1,1,1,0
    # Zero rotation: rot6d = (1,0,0, 0,1,0) with zero spread.
    assert raw["mean"][3:9] == pytest.approx([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    assert raw["std"][3:9] == pytest.approx([0.0] * 6)
    meta = stats["metadata"]
    assert (meta["num_chunks"], meta["num_rows_stats"], meta["num_frames"]) == (2, 4, 4)
    assert (meta["rotation_format"], meta["normalization"], meta["chunk_length"]) == (
        "rot6d",
        "quantile_rot",
        2,
    )


def test_global_block_keeps_rotation_at_identity() -> None:
    rng = np.random.default_rng(1)
    ep = np.concatenate([rng.normal(size=(40, 6)) * 0.2, rng.integers(0, 2, size=(40, 1))], axis=1)
    stats = compute_action_stats([ep], chunk_length=16)
    identity = {"mean": 0.0, "std": 1.0, "min": -1.0, "max": 1.0, "q01": -1.0, "q99": 1.0}
    for field, value in identity.items():
        assert stats["global"][field][3:9] == [value] * 6
        assert stats["global"][field][:3] == stats["global_raw"][field][:3]
        assert stats["global"][field][9] == stats["global_raw"][field][9]
    assert stats["global_raw"]["q01"][3:9] != [-1.0] * 6
    assert stats["metadata"]["skip_rotation_dims"] == [3, 4, 5, 6, 7, 8]


@st.composite
def episode_sets(draw: st.DrawFn) -> tuple[list[np.ndarray], int]:
    chunk_length = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, 15), min_size=1, max_size=5))
    if all(n <= chunk_length for n in lengths):
        lengths[0] = chunk_length + 1
    episodes = []
    for n in lengths:
        body = draw(hnp.arrays(np.float64, (n, 6), elements=st.floats(-1.5, 1.5)))
        grip = draw(hnp.arrays(np.float64, (n, 1), elements=st.sampled_from([0.0, 0.25, 1.0])))
        episodes.append(np.concatenate([body, grip], axis=1))
    return episodes, chunk_length


@settings(max_examples=60, deadline=None)
@given(data=episode_sets())
def test_stats_equal_brute_force_over_all_chunks(data) -> None:
    episodes, chunk_length = data
    stats = compute_action_stats(episodes, chunk_length=chunk_length)
    chunks = [(e, s) for e, ep in enumerate(episodes) for s in range(len(ep) - chunk_length)]
    expected = brute_force_block(episodes, np.array(chunks), chunk_length)
    for field in STAT_FIELDS:
        np.testing.assert_allclose(
            stats["global_raw"][field], expected[field], rtol=1e-9, atol=1e-9, err_msg=field
        )
    assert stats["metadata"]["num_chunks"] == len(chunks)


@settings(max_examples=30, deadline=None)
@given(data=episode_sets(), max_samples=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_stats_over_a_seeded_subset(data, max_samples: int, seed: int) -> None:
    episodes, chunk_length = data
    lengths = [len(e) for e in episodes]
    chunks = select_chunks(lengths, chunk_length, max_samples, seed)
    total = sum(max(0, n - chunk_length) for n in lengths)
    assert len(chunks) == min(max_samples, total)
    assert len({tuple(c) for c in chunks}) == len(chunks)  # without replacement
    assert all(0 <= s < lengths[e] - chunk_length for e, s in chunks)
    np.testing.assert_array_equal(
        select_chunks(lengths, chunk_length, max_samples, seed), chunks
    )  # reproducible
    stats = compute_action_stats(episodes, chunk_length=chunk_length, max_samples=max_samples, seed=seed)
    expected = brute_force_block(episodes, chunks, chunk_length)
    for field in STAT_FIELDS:
        np.testing.assert_allclose(
            stats["global_raw"][field], expected[field], rtol=1e-9, atol=1e-9, err_msg=field
        )
    assert (stats["metadata"]["seed"], stats["metadata"]["max_samples"]) == (seed, max_samples)


@settings(max_examples=100, deadline=None)
@given(
    values=hnp.arrays(np.float64, st.tuples(st.integers(1, 12), st.just(2)), elements=st.floats(-3, 3)),
    data=st.data(),
    q=st.floats(0, 1),
)
def test_weighted_quantile_equals_quantile_of_repeated_rows(values: np.ndarray, data, q: float) -> None:
    weights = data.draw(hnp.arrays(np.int64, values.shape[0], elements=st.integers(1, 5)))
    expected = np.quantile(np.repeat(values, weights, axis=0), q, axis=0)
    np.testing.assert_allclose(weighted_quantile(values, weights, q), expected, rtol=1e-12, atol=1e-12)


def test_computation_errors() -> None:
    with pytest.raises(ValueError, match="at least chunk_length \\+ 1 = 17 frames"):
        compute_action_stats([np.zeros((16, 7)), np.zeros((3, 7))], chunk_length=16)
    with pytest.raises(ValueError, match=r"episode 1: expected actions of shape \[T, 7\]"):
        compute_action_stats([np.zeros((20, 7)), np.zeros((20, 10))])
    commands = np.zeros((20, 7))
    commands[:, 6] = -1.0  # LIBERO's -1/+1 command convention, not the stored g
    with pytest.raises(ValueError, match="libero_command_to_dataset_gripper"):
        compute_action_stats([commands])
    with pytest.raises(ValueError, match="NaN"):
        compute_action_stats([np.full((20, 7), np.nan)])
