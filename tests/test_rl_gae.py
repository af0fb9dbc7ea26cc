"""GAE (rlinf_cosmos3.rl.gae) against a hand-computed 4-decision trajectory with a termination and a truncation.

gamma 0.99, lambda 0.95 (gamma * lambda = 0.9405). Env 0 (auto-reset):

    t  episode  r  V    terminated  truncated  V' (next value)
    0  1        0  0.5  .           .          0.6  (V of t = 1)
    1  1        1  0.6  yes         .          -    (unused: the future is over)
    2  2        0  0.4  .           .          0.3  (V of t = 3)
    3  2        0  0.3  .           yes        0.2  (the observation the cap stopped at)

    delta_3 = 0 + 0.99 * 0.2 - 0.3 = -0.102          A_3 = -0.102              (episode ends: no carry)
    delta_2 = 0 + 0.99 * 0.3 - 0.4 = -0.103          A_2 = -0.103 + 0.9405 * -0.102 = -0.198931
    delta_1 = 1 + 0          - 0.6 =  0.4            A_1 =  0.4                (terminated: no carry from t = 2)
    delta_0 = 0 + 0.99 * 0.6 - 0.5 =  0.094          A_0 =  0.094 + 0.9405 * 0.4 = 0.4702
    returns = A + V = [0.9702, 1.0, 0.201069, 0.198]

Env 1 runs through the window (no episode end): V = [0.1, 0.2, 0.3, 0.4], V after the window 0.5, r = 0:
delta_t = 0.99 V_{t+1} - V_t = [0.098, 0.097, 0.096, 0.095], A = [0.353175824, 0.27131932375, 0.1853475, 0.095].
"""

from __future__ import annotations

import pytest
import torch

from rlinf_cosmos3.rl.gae import compute_gae, next_values_of, normalize_advantages


def _trajectory() -> dict[str, torch.Tensor]:
    col = lambda a, b: torch.tensor([a, b], dtype=torch.float64)  # noqa: E731 - one row of [T, B=2]
    return {
        "rewards": torch.stack([col(0, 0), col(1, 0), col(0, 0), col(0, 0)]),
        "values": torch.stack([col(0.5, 0.1), col(0.6, 0.2), col(0.4, 0.3), col(0.3, 0.4)]),
        "terminated": torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=torch.bool),
        "truncated": torch.tensor([[0, 0], [0, 0], [0, 0], [1, 0]], dtype=torch.bool),
        "last_values": col(0.9, 0.5),  # env 0's 0.9 must not be used: its last decision was truncated
        "final_values": torch.zeros(4, 2, dtype=torch.float64).index_put_((torch.tensor([3]), torch.tensor([0])),
                                                                          torch.tensor([0.2], dtype=torch.float64)),
    }


def test_gae_hand_computed_with_termination_truncation_and_window_end() -> None:
    tr = _trajectory()
    nxt = next_values_of(tr["values"], tr["last_values"], tr["truncated"], tr["final_values"])
    torch.testing.assert_close(nxt[:, 1], torch.tensor([0.2, 0.3, 0.4, 0.5], dtype=torch.float64))
    assert nxt[3, 0].item() == pytest.approx(0.2) and nxt[0, 0].item() == pytest.approx(0.6)
    adv, ret = compute_gae(tr["rewards"], tr["values"], nxt, tr["terminated"], tr["truncated"], 0.99, 0.95)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.4702, 0.4, -0.198931, -0.102], dtype=torch.float64))
    torch.testing.assert_close(ret[:, 0], torch.tensor([0.9702, 1.0, 0.201069, 0.198], dtype=torch.float64))
    torch.testing.assert_close(adv[:, 1], torch.tensor([0.353175824, 0.27131932375, 0.1853475, 0.095],
                                                       dtype=torch.float64))


def test_truncation_bootstraps_where_termination_does_not() -> None:
    tr = _trajectory()
    nxt = next_values_of(tr["values"], tr["last_values"], tr["truncated"], tr["final_values"])
    # the same last step counted as a termination: V' = 0, A_3 = 0 - 0.3
    adv, _ = compute_gae(tr["rewards"], tr["values"], nxt, tr["terminated"] | tr["truncated"],
                         torch.zeros_like(tr["truncated"]))
    assert adv[3, 0].item() == pytest.approx(-0.3)
    # and without any episode end, the termination's step would carry the next episode's advantage back
    adv_carry, _ = compute_gae(tr["rewards"], tr["values"], nxt, torch.zeros_like(tr["terminated"]),
                               torch.zeros_like(tr["truncated"]))
    assert adv_carry[1, 0].item() != pytest.approx(0.4)


def test_gamma_and_lambda_one_give_monte_carlo_returns() -> None:
    rewards = torch.tensor([[0.0], [0.0], [1.0]])
    values = torch.tensor([[0.2], [0.7], [0.1]])
    done = torch.tensor([[False], [False], [True]])
    nxt = next_values_of(values, torch.tensor([5.0]))
    adv, ret = compute_gae(rewards, values, nxt, done, torch.zeros_like(done), gamma=1.0, gae_lambda=1.0)
    torch.testing.assert_close(ret, torch.ones(3, 1))  # every state's return is the final success
    torch.testing.assert_close(adv, 1.0 - values)


def test_truncation_needs_the_final_values_and_shapes_must_agree() -> None:
    tr = _trajectory()
    with pytest.raises(ValueError, match="final_values"):
        next_values_of(tr["values"], tr["last_values"], tr["truncated"])
    with pytest.raises(ValueError, match="shape"):
        compute_gae(tr["rewards"], tr["values"][:3], tr["values"], tr["terminated"], tr["truncated"])


def test_normalize_advantages_over_the_counted_decisions() -> None:
    # counted [1, 2, 3]: mean 2, population std sqrt(2/3) = 0.816497
    adv = torch.tensor([1.0, 2.0, 3.0, 100.0])
    out = normalize_advantages(adv, torch.tensor([True, True, True, False]), eps=0.0)
    torch.testing.assert_close(out, torch.tensor([-1.2247449, 0.0, 1.2247449, 0.0]))
