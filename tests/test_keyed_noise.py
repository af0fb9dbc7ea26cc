"""Counter-based training noise (``models/cosmos3/keyed_noise.py``): Philox4x32-10 bit-exact, its normals
standard, and every draw of a sample a function of (seed, step, dataset index) alone."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlinf_cosmos3.config.objective import ObjectiveConfig
from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig
from rlinf_cosmos3.models.cosmos3.flow_matching import keyed_draws, keyed_dropout
from rlinf_cosmos3.models.cosmos3.keyed_noise import (
    STREAM_VISION,
    NoiseKeys,
    keyed_words,
    legacy_sample_seed,
    normal_from_words,
    philox4x32,
    uniform_from_words,
)
from rlinf_cosmos3.models.cosmos3.processor import EncodedSample

# Random123's known-answer vectors (kat_vectors): philox4x32 10 rounds, counter, key -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_philox_matches_the_known_answers(counter: tuple, key: tuple, expected: tuple) -> None:
    lanes = philox4x32([torch.tensor([c], dtype=torch.int64) for c in counter], key)
    assert tuple(int(lane[0]) for lane in lanes) == expected
    # Broadcast ints in the counter give the same words as tensors.
    mixed = philox4x32([torch.tensor([counter[0]]), counter[1], torch.tensor([counter[2]]), counter[3]], key)
    assert all(torch.equal(a, b) for a, b in zip(lanes, mixed, strict=True))


def test_normals_are_standard_and_uniforms_in_unit_interval() -> None:
    keys = NoiseKeys(seed=11, step=3, indexes=torch.arange(64))
    (words,) = keyed_words(keys, [(STREAM_VISION, 4096)], "cpu")
    assert words.shape == (64, 4096) and int(words.min()) >= 0 and int(words.max()) < 2**32
    uniform = uniform_from_words(words)
    assert float(uniform.min()) >= 0 and float(uniform.max()) < 1
    assert torch.equal(uniform * 2**24, (uniform * 2**24).round())  # k / 2**24, like torch.rand
    z = normal_from_words(words).flatten().double()
    n = z.numel()
    assert abs(float(z.mean())) < 5 / math.sqrt(n)
    assert abs(float(z.std()) - 1) < 0.01
    assert abs(float((z**3).mean())) < 0.02 and abs(float((z**4).mean()) - 3) < 0.05
    # Neighbouring samples and elements are uncorrelated.
    flat = normal_from_words(words)
    assert abs(float(torch.corrcoef(flat[:2])[0, 1])) < 0.06
    assert abs(float(torch.corrcoef(torch.stack([flat[0, :-1], flat[0, 1:]]))[0, 1])) < 0.06


def _sample(frames: int = 5) -> EncodedSample:
    return EncodedSample(input_ids=[1, 2], uncond_input_ids=[1], x0_vision=torch.zeros(1, 48, frames, 12, 20),
                         vision_frame_valid=torch.ones(frames, dtype=torch.bool), x0_action=torch.zeros(16, 64),
                         action_valid=torch.ones(16, dtype=torch.bool))


def test_a_samples_draws_depend_on_its_key_alone() -> None:
    """Whatever batch (rank, pack) a sample lands in, it draws the same sigma, noise and dropout coin."""
    cfg = PolicyConfig(objective=ObjectiveConfig(caption_dropout=0.5))
    keys = NoiseKeys(seed=5, step=17, indexes=torch.tensor([40, 3, 977, 12]))
    whole = keyed_draws(cfg, [_sample()] * 4, keys, torch.device("cpu"))
    for rows in ([1], [2, 0], [3, 1, 2]):
        part = keyed_draws(cfg, [_sample()] * len(rows), keys.subset(rows), torch.device("cpu"))
        assert torch.equal(part.sigma, whole.sigma[rows]) and torch.equal(part.eps_vision, whole.eps_vision[rows])
        assert torch.equal(part.eps_action, whole.eps_action[rows])
        assert part.dropped == [whole.dropped[r] for r in rows]
    # A pack's draws: its samples' rows, frames concatenated along time.
    pack = whole.for_pack([1, 2])
    assert torch.equal(pack.eps_vision, torch.cat([whole.eps_vision[1:2], whole.eps_vision[2:3]], dim=2))
    assert torch.equal(pack.eps_action, torch.cat([whole.eps_action[1], whole.eps_action[2]]))
    # Samples of other shapes draw one at a time, the same numbers as alone.
    mixed = keyed_draws(cfg, [_sample(), _sample(3)], keys.subset([0, 1]), torch.device("cpu"))
    short = keyed_draws(cfg, [_sample(3)], keys.subset([1]), torch.device("cpu"))
    assert torch.equal(mixed.eps_vision[1], short.eps_vision) and torch.equal(mixed.sigma[:1], whole.sigma[:1])
    # Another seed, step or index draws other numbers.
    for other in (dataclasses.replace(keys, seed=6), dataclasses.replace(keys, step=18),
                  dataclasses.replace(keys, indexes=keys.indexes + 1)):
        drawn = keyed_draws(cfg, [_sample()] * 4, other, torch.device("cpu"))
        assert not torch.equal(drawn.eps_vision, whole.eps_vision) and not torch.equal(drawn.sigma, whole.sigma)


def test_the_actions_own_sigma_leaves_the_other_draws_alone() -> None:
    keys = NoiseKeys(seed=1, step=2, indexes=torch.arange(6))
    shared = keyed_draws(PolicyConfig(), [_sample()] * 6, keys, torch.device("cpu"))
    own_sigma = PolicyConfig(objective=ObjectiveConfig(action_sigma_distribution="uniform"))
    own = keyed_draws(own_sigma, [_sample()] * 6, keys, torch.device("cpu"))
    assert torch.equal(shared.sigma, shared.sigma_action) and torch.equal(own.sigma, shared.sigma)
    assert torch.equal(own.eps_vision, shared.eps_vision) and not torch.equal(own.sigma_action, own.sigma)
    assert float(own.sigma.min()) >= 0 and float(own.sigma.max()) <= 1


def test_caption_dropout_rate_and_seeds() -> None:
    keys = NoiseKeys(seed=0, step=0, indexes=torch.arange(4000))
    assert sum(keyed_dropout(keys, 0.1)) == pytest.approx(400, abs=60)
    assert keyed_dropout(keys, 0.0) == [False] * 4000
    assert NoiseKeys(3, 4, torch.tensor([5, 6])).sample_seeds() == [legacy_sample_seed(3, 4, 5),
                                                                    legacy_sample_seed(3, 4, 6)]
