"""Our conventions against the reference implementations' own outputs (tests/data/parity_reference.json).

The reference vectors were produced by running cosmos-framework's and RLinf's own functions, by
``tests/data/make_parity_reference.py`` (which says exactly what ran and on which inputs):
NVIDIA/cosmos-framework at 5eee9ed574255f017b192161bfbb5a10253d65cf (release 2026-08-21) and
RLinf/RLinf at 6ac23065bcd05565b6e9534ec8c2dba4d6051eff. The inputs are stored next to the outputs:

* rot6d: 12 non-orthonormal 6-vectors (seeded random rotations, ``default_rng(15)``, plus N(0, 0.002)
  or N(0, 0.05) noise, some scaled), decoded by ``closed_loop_eval._rotation_repr_to_mat`` and
  ``_framewise_action_to_delta``;
* gripper: values in and around each convention's range through ``closed_loop_eval._remap_gripper``
  (continuous) and RLinf's ``prepare_actions_for_libero`` (binarised ``zero_one``);
* captions: five LIBERO tasks (one with trailing spaces, one ending in ".", one with three " | "
  paraphrases) through ``LIBEROLeRobotDataset._build_item`` + ``ActionPromptJsonFormatter``
  (training, for six chunks of a 40-frame demo with idle stretches) and through the closed-loop
  eval's prompt augmentation + the policy server's JSON caption (eval).

Pure functions only: nothing here loads a model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf_cosmos3.actions import (
    actions_7_to_10,
    actions_10_to_7,
    count_idle_frames,
    dataset_gripper_to_libero_command,
    rot6d_to_matrix,
)
from rlinf_cosmos3.models.cosmos3.captions import (
    cosmos_framework_eval_caption,
    cosmos_framework_eval_description,
    cosmos_framework_training_caption,
    eval_request_text,
    paraphrases,
)
from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig
from rlinf_cosmos3.models.cosmos3.processor import PolicyProcessor

REF = json.loads((Path(__file__).parent / "data" / "parity_reference.json").read_text())
CANVAS = {"action_horizon": 16, "num_frames": 17, "fps": 20.0, "height": 192, "width": 320}
# Their code decodes in float32, ours in float64: agreement to float32 rounding.
FLOAT32_ATOL = 2e-6


def test_reference_was_made_from_the_pinned_commits() -> None:
    assert REF["sources"]["cosmos_framework"]["commit"] == "5eee9ed574255f017b192161bfbb5a10253d65cf"
    assert REF["sources"]["rlinf"]["commit"] == "6ac23065bcd05565b6e9534ec8c2dba4d6051eff"


# ----------------------------------------------------------------------------- rot6d decode


def test_rot6d_decodes_as_cosmos_framework_eval() -> None:
    inputs = np.array(REF["rot6d"]["inputs"])
    theirs = np.array(REF["rot6d"]["matrices"])
    cols = inputs.reshape(-1, 2, 3)
    assert np.abs(np.einsum("ni,ni->n", cols[:, 0], cols[:, 1])).max() > 1e-3  # really not orthonormal
    np.testing.assert_allclose(rot6d_to_matrix(inputs), theirs, atol=FLOAT32_ATOL)
    # What the eval sends the simulator: translation and gripper through, rotation vector from the decode.
    np.testing.assert_allclose(actions_10_to_7(np.array(REF["rot6d"]["actions10"])), np.array(REF["rot6d"]["actions7"]),
                               atol=FLOAT32_ATOL)


def test_gram_schmidt_is_not_the_reference_decode() -> None:
    """The test above can fail: Gram-Schmidt (RLinf's decode, ours before) is off by far more than rounding."""
    inputs = np.array(REF["rot6d"]["inputs"])
    gap = np.abs(rot6d_to_matrix(inputs, "gram_schmidt") - np.array(REF["rot6d"]["matrices"])).max()
    assert gap > 100 * FLOAT32_ATOL


@settings(max_examples=200, deadline=None)
@given(r6=st.lists(st.floats(-10, 10, allow_nan=False), min_size=6, max_size=6))
def test_svd_decode_is_the_rotation_nearest_to_c0_c1_c0xc1(r6: list[float]) -> None:
    v = np.array(r6)
    a0, a1 = v[:3], v[3:]
    if np.linalg.norm(a0) < 1e-3 or np.linalg.norm(np.cross(a0, a1)) < 1e-3 * np.linalg.norm(a0) * max(
            np.linalg.norm(a1), 1e-3):
        return  # degenerate: an error, as for Gram-Schmidt (tests/test_actions_rotation.py)
    rot = rot6d_to_matrix(v)
    np.testing.assert_allclose(rot.T @ rot, np.eye(3), atol=1e-10)
    assert np.linalg.det(rot) == pytest.approx(1.0, abs=1e-10)
    stacked = np.stack([a0, a1, np.cross(a0, a1)], axis=-1)
    # No other rotation is closer (in the Frobenius norm) to [c0, c1, c0 x c1]: Gram-Schmidt's is not.
    gs = rot6d_to_matrix(v, "gram_schmidt")
    assert np.linalg.norm(rot - stacked) <= np.linalg.norm(gs - stacked) + 1e-9
    # On an exact rot6d both decodes give the rotation itself.
    np.testing.assert_allclose(rot6d_to_matrix(np.concatenate([rot[:, 0], rot[:, 1]])), rot, atol=1e-10)


# ----------------------------------------------------------------------------- gripper


@pytest.mark.parametrize("convention", ["zero_one", "pm_one", "pm_one_flip"])
def test_continuous_gripper_command_is_cosmos_framework_remap(convention: str) -> None:
    ref = REF["gripper"][convention]
    ours = dataset_gripper_to_libero_command(np.array(ref["values"]), convention, "continuous")
    np.testing.assert_allclose(ours, ref["continuous"], atol=1e-12)


@pytest.mark.parametrize("convention", ["zero_one", "pm_one", "pm_one_flip"])
def test_binary_gripper_command_is_the_sign_of_the_reference_command(convention: str) -> None:
    """Binary = open (-1) where the reference's continuous command opens, close (+1) elsewhere (tie included)."""
    ref = REF["gripper"][convention]
    ours = dataset_gripper_to_libero_command(np.array(ref["values"]), convention, "binary")
    continuous = np.array(ref["continuous"])
    assert set(ours.tolist()) == {-1.0, 1.0}
    np.testing.assert_array_equal(ours, np.where(continuous < 0, -1.0, 1.0))


def test_binary_zero_one_is_rlinfs_rule_except_the_tie() -> None:
    ref = REF["gripper"]["zero_one"]
    values, rlinf = np.array(ref["values"]), np.array(ref["rlinf_binary"])
    ours = dataset_gripper_to_libero_command(values)  # the defaults: zero_one, binary
    tie = values == 0.5
    np.testing.assert_array_equal(ours[~tie], rlinf[~tie])
    assert rlinf[tie].tolist() == [0.0] and ours[tie].tolist() == [1.0]  # np.sign's 0 "neither" command; we close


# ----------------------------------------------------------------------------- idle frames and captions


def _chunk10(start: int) -> np.ndarray:
    return actions_7_to_10(np.array(REF["demo_actions"])[start:start + REF["chunk_length"]])


def test_idle_frames_are_counted_as_cosmos_framework_counts_them() -> None:
    counts = {(t["start"], t["idle_frames"]) for t in REF["training_captions"]}
    assert {n for _, n in counts} == {4, 5, 7, 11}  # the demo's idle stretches give different counts
    for start, idle in counts:
        assert count_idle_frames(_chunk10(start), REF["fps"]) == idle, start


def test_paraphrases_are_split_as_the_reference_splits_them() -> None:
    for task, expected in REF["paraphrases"].items():
        assert paraphrases(task) == expected


def test_training_captions_byte_for_byte() -> None:
    assert any(len(v) > 1 for v in REF["paraphrases"].values())  # a " | " task is among them
    for ref in REF["training_captions"]:
        idle = count_idle_frames(_chunk10(ref["start"]), REF["fps"])
        ours = cosmos_framework_training_caption(ref["paraphrase"], idle_frames=idle, **CANVAS)
        assert ours == ref["caption"], (ref["task"], ref["start"])


def test_eval_captions_byte_for_byte() -> None:
    for ref in REF["eval_captions"]:
        task = ref["task"].strip()  # the adapter strips the simulator's task text first
        assert cosmos_framework_eval_description(task) == ref["description"].strip()
        assert cosmos_framework_eval_caption(task, **CANVAS) == ref["caption"], task
        # Building the caption from the description the request carries changes nothing.
        assert cosmos_framework_eval_caption(eval_request_text("cosmos_framework", task), **CANVAS) == ref["caption"]
        assert eval_request_text("diffusers", task) == task


def test_training_caption_draws_every_paraphrase_reproducibly() -> None:
    """The processor picks one paraphrase per sample from (seed, step, index), like NVIDIA's random.choice."""
    task = next(t for t, v in REF["paraphrases"].items() if len(v) > 1)
    processor = PolicyProcessor(None, PolicyConfig(caption_style="cosmos_framework"), raw_action_dim=10)
    references = {(r["paraphrase"], r["start"]): r["caption"] for r in REF["training_captions"] if r["task"] == task}
    idle = count_idle_frames(_chunk10(0), REF["fps"])
    seen = set()
    for seed in range(40):
        generator = torch.Generator().manual_seed(seed)
        caption = processor.training_caption(task, idle, generator)
        assert caption == processor.training_caption(task, idle, torch.Generator().manual_seed(seed))
        assert generator.initial_seed() == seed and torch.equal(generator.get_state(),
                                                               torch.Generator().manual_seed(seed).get_state())
        choice = next(p for p in REF["paraphrases"][task] if caption == references[(p, 0)])
        seen.add(choice)
    assert seen == set(REF["paraphrases"][task])
