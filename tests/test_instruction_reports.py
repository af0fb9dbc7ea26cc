"""Reports of instruction swaps and ablations (issue #31) on hand-made results.jsonl files, against
hand-computed numbers: success_report's per-task rows (trained / held-out init states), swap and ablation
rows, each with its Wilson 95 % interval, and the one-sided Fisher exact test instructed vs ablated;
compare_runs naming each run's conditions; the eval's own table and log line.

Fisher's one-sided p that B succeeds less often than A is the hypergeometric tail P(X >= a) of A's
successes given both margins: 9/10 vs 4/10 -> (C(13,9)C(7,1) + C(13,10)C(7,0)) / C(20,10) = 5291/184756;
5/5 vs 2/5 -> C(7,5) / C(10,5) = 21/252; pooled 14/15 vs 6/15 -> (C(20,14)C(10,1) + C(20,15)) / C(30,15)
= 403104/155117520.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
import sys
from math import comb
from pathlib import Path

import numpy as np
import pytest

from rlinf_cosmos3.tracking.success import wilson_interval
from rlinf_cosmos3.tracking.success_table import success_table
from rlinf_cosmos3.workers.env.results import EpisodeResult, episode_log_line

REPO = Path(__file__).resolve().parent.parent
WORDS = {0: "open the middle drawer of the cabinet", 1: "put the bowl on the stove", 8: "put the bowl on the plate"}


def _cli(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem + "_swap_cli", REPO / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _main(relative: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = _cli(relative).main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _episodes(task: int, trials: range, successes: int, *, source: int | None = None,
              instruction: str | None = None) -> list[dict]:
    """Rows as the eval writes them: the first ``successes`` trials succeed."""
    return [EpisodeResult(suite="libero_goal", task_id=task, trial_id=t, success_once=i < successes,
                          success_at_end=i < successes, steps=120, task_description=WORDS[task],
                          instruction=WORDS[task] if instruction is None else instruction,
                          init_state_task_id=task if source is None else source).to_dict()
            for i, t in enumerate(trials)]


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    return {
        "trained": _run(tmp_path / "trained", _episodes(0, range(4), 3)),
        "instructed": _run(tmp_path / "instructed", _episodes(0, range(40, 50), 9) + _episodes(1, range(40, 45), 5)),
        "ablated": _run(tmp_path / "ablated", _episodes(0, range(40, 50), 4, instruction="")
                        + _episodes(1, range(40, 45), 2, instruction="")),
        "swap": _run(tmp_path / "swap", _episodes(8, range(4), 4) + _episodes(1, range(4), 0, source=8)),
    }


def test_hand_computed_fisher_tails() -> None:
    """The numbers the tests below assert, from the hypergeometric formula itself."""
    assert comb(13, 9) * comb(7, 1) + comb(13, 10) == 5291 and comb(20, 10) == 184756
    assert comb(7, 5) == 21 and comb(10, 5) == 252
    assert comb(20, 14) * comb(10, 1) + comb(20, 15) == 403104 and comb(30, 15) == 155117520


def test_success_report_has_task_swap_and_ablation_rows_and_the_fisher_test(runs, tmp_path) -> None:
    out = tmp_path / "report.json"
    rc, printed, err = _main("toolkits/eval/success_report.py",
                             "--group", "trained", f"{runs['trained']}:0-39",
                             "--group", "held_out", f"{runs['instructed']}:40-49",
                             "--group", "swap", str(runs["swap"]),
                             "--group", "ablated", f"{runs['ablated']}:40-49",
                             "--ablation", "held_out", "ablated", "--out", str(out))
    assert rc == 0, err
    doc = json.loads(out.read_text())
    once = {name: doc[name]["success_once"] for name in ("trained", "held_out", "swap", "ablated")}
    # per task, trained and held-out init states, each with its Wilson interval
    assert once["trained"]["tasks"]["0"]["successes"] == 3 and once["trained"]["tasks"]["0"]["trials"] == 4
    assert once["held_out"]["tasks"]["0"]["ci95"] == pytest.approx([0.5958, 0.9821], abs=1e-4)  # 9/10 by hand
    assert once["held_out"]["tasks"]["1"]["ci95"] == list(wilson_interval(5, 5))
    assert once["held_out"]["conditions"] == [] and once["held_out"]["overall"]["trials"] == 15
    # the swap: task 8 plain, task 1 from task 8's init states a row of its own
    assert list(once["swap"]["tasks"]) == ["8"] and once["swap"]["tasks"]["8"]["successes"] == 4
    [swap] = once["swap"]["conditions"]
    assert (swap["label"], swap["task_id"], swap["init_state_task_id"], swap["instruction"]) == \
        ("libero_goal task 1 from task 8's init states", 1, 8, None)
    assert (swap["successes"], swap["trials"]) == (0, 4) and swap["ci95"] == list(wilson_interval(0, 4))
    # the ablation: every row is a condition (instruction '' instead of the task's)
    assert once["ablated"]["tasks"] == {}
    assert [(c["label"], c["instruction"], c["successes"], c["trials"]) for c in once["ablated"]["conditions"]] == [
        ("libero_goal task 0, instruction ''", "", 4, 10), ("libero_goal task 1, instruction ''", "", 2, 5)]
    # one-sided Fisher exact: the ablated rows succeed less often
    test = doc["ablation_test"]
    assert (test["instructed"], test["ablated"]) == ("held_out", "ablated")
    p0, p1 = (t["p_worse"] for t in test["tasks"])
    assert p0 == pytest.approx(5291 / 184756, rel=1e-9) and p1 == pytest.approx(21 / 252, rel=1e-9)
    assert test["pooled"]["p_worse"] == pytest.approx(403104 / 155117520, rel=1e-9)
    assert (test["pooled"]["a"]["successes"], test["pooled"]["b"]["successes"]) == (14, 6)
    assert test["tasks"][0]["difference"] == pytest.approx(-0.5)
    # what the user reads
    assert "  task 0: success_once  90.0% [59.6%, 98.2%] (9/10)" in printed
    assert "  libero_goal task 1 from task 8's init states: success_once   0.0% [ 0.0%, 49.0%] (0/4)" in printed
    assert "  libero_goal task 0, instruction '': success_once  40.0%" in printed
    assert "ablation test, success_once: held_out (instructed) vs ablated (ablated)" in printed
    assert "p = 0.02864" in printed and "p = 0.08333" in printed and "p = 0.002599" in printed


@pytest.mark.parametrize(("groups", "text"), [
    (("ablated", "held_out"), "the instructed rows include ablated ones"),
    (("held_out", "trained"), "the ablated rows include rows sent their task's own instruction"),
    (("held_out", "nobody"), "names group(s) ['nobody'] that no --group defines"),
    (("swap", "ablated"), "tasks start from other init states in the instructed rows than in the ablated ones: "
     "libero_goal task 1 from task 8's vs task 1's"),
])
def test_an_ablation_test_of_the_wrong_groups_exits_2(runs, tmp_path, groups, text) -> None:
    rc, _, err = _main("toolkits/eval/success_report.py", "--group", "held_out", str(runs["instructed"]),
                       "--group", "ablated", str(runs["ablated"]), "--group", "trained", str(runs["trained"]),
                       "--group", "swap", str(runs["swap"]), "--ablation", *groups, "--out", str(tmp_path / "x.json"))
    assert rc == 2 and text in err, err
    assert not (tmp_path / "x.json").exists()


def test_compare_runs_instructed_against_ablated_names_the_conditions(runs, tmp_path) -> None:
    rc, printed, err = _main("toolkits/eval/compare_runs.py", str(runs["instructed"]), str(runs["ablated"]),
                             "--json", str(tmp_path / "cmp.json"))
    assert rc == 1, printed + err  # the pooled drop is significant at 0.05 (p = 0.0026)
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["conditions_a"] == [] and doc["conditions_b"] == ["libero_goal task 0, instruction ''",
                                                                 "libero_goal task 1, instruction ''"]
    assert [t["p_worse"] for t in doc["tasks"]] == pytest.approx([5291 / 184756, 21 / 252], rel=1e-9)
    assert doc["pooled"]["p_worse"] == pytest.approx(403104 / 155117520, rel=1e-9)
    assert "B ran libero_goal task 0, instruction ''" in printed
    rc, printed, _ = _main("toolkits/eval/compare_runs.py", str(runs["swap"]), str(runs["instructed"]))
    assert "A ran libero_goal task 1 from task 8's init states" in printed and rc == 0  # 0/4 vs 5/5: B better


def test_the_eval_table_and_log_line_name_the_swap() -> None:
    rows = _episodes(8, range(2), 2) + _episodes(1, range(2), 0, source=8)
    table = success_table(rows, {"libero_goal": 300}).splitlines()
    assert table[2].split("  ")[1].startswith("1 from task 8's init states: put the bowl")
    assert table[3].split("  ")[1].startswith("8 put the bowl on the plate")
    swapped, plain = (EpisodeResult(**rows[i]) for i in (2, 0))
    assert episode_log_line(swapped) == "[libero eval] task_id=1, trial_id=0, success=False, init_state_task_id=8"
    assert episode_log_line(plain) == "[libero eval] task_id=8, trial_id=0, success=True"
    old = EpisodeResult(suite="libero_goal", task_id=3, trial_id=0, success_once=True, success_at_end=True, steps=9)
    assert episode_log_line(old) == "[libero eval] task_id=3, trial_id=0, success=True"  # rows before the fields


def test_the_replay_backend_plays_the_recording_of_the_swapped_start(tmp_path) -> None:
    """Task 1 started from task 8's init state 0 gets task 8's recorded actions (there is no task 1 recording)."""
    from rlinf_cosmos3.actions import ActionNormalizer, encode_model_actions
    from rlinf_cosmos3.config.replay import ReplayConfig
    from rlinf_cosmos3.config.rollout import RolloutModelConfig
    from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter
    from rlinf_cosmos3.workers.rollout.replay import ReplayBackend

    stats_doc = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": [-1.0] * 10, "max": [1.0] * 10,
                 "q01": [-1.0] * 9 + [0.0], "q99": [1.0] * 10}
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"metadata": {"fps": 20, "chunk_length": 16}, "global": stats_doc,
                                 "global_raw": stats_doc}))
    model = RolloutModelConfig(model_path="", action_stats_path=str(stats), action_normalization="quantile_rot")
    backend = ReplayBackend(model, ReplayConfig(dataset_root=str(tmp_path)))
    recorded = np.concatenate([np.random.default_rng(0).uniform(-0.3, 0.3, (20, 6)), np.ones((20, 1))], axis=1)
    backend._encoded = {(8, 0): encode_model_actions(recorded, ActionNormalizer(str(stats), "quantile_rot"))[0]}
    obs = {"main_images": np.zeros((1, 64, 64, 3), np.uint8), "wrist_images": np.zeros((1, 64, 64, 3), np.uint8),
           "task_descriptions": [""], "task_ids": np.array([1]), "trial_ids": np.array([0]),
           "init_state_task_ids": np.array([8]), "episode_steps": np.array([0])}
    out = asyncio.run(Cosmos3ActionAdapter(model, 8).predict(obs, backend))
    np.testing.assert_allclose(out[0, :, :6], recorded[:16, :6], atol=1e-5)
    with pytest.raises(KeyError, match="task 1, init state 0"):  # without the column: task 1's own start
        asyncio.run(Cosmos3ActionAdapter(model, 8).predict({k: v for k, v in obs.items()
                                                             if k != "init_state_task_ids"}, backend))


def _lifting(task: int, trials: range, lifts: int, successes: int, **kw) -> list[dict]:
    """The first ``lifts`` trials pick the bowl up 12 cm, the rest leave it on the table; the first
    ``successes`` (<= lifts) succeed."""
    rows = _episodes(task, trials, successes, **kw)
    for i, row in enumerate(rows):
        row["object_lift_m"] = {"akita_black_bowl_1": 0.12 if i < lifts else 0.004}
    return rows


def test_after_a_lift_the_instruction_decides_where_the_object_goes(tmp_path) -> None:
    """Grasping is the same skill under any instruction: the report counts the episodes that lifted the
    object and, of those, the ones that reached the goal, and runs the Fisher test on the lifted ones only.
    Instructed 6 of 8 lifted vs ablated 1 of 8 lifted: P(X >= 6) with margins 7 successes of 16, 8 drawn
    = (C(7,6) C(9,2) + C(7,7) C(9,1)) / C(16,8) = 261 / 12870."""
    assert comb(7, 6) * comb(9, 2) + comb(9, 1) == 261 and comb(16, 8) == 12870
    instructed = _run(tmp_path / "i", _lifting(0, range(40, 50), 8, 6))
    ablated = _run(tmp_path / "a", _lifting(0, range(40, 50), 8, 1, instruction=""))
    out = tmp_path / "report.json"
    rc, printed, err = _main("toolkits/eval/success_report.py", "--group", "held_out", str(instructed),
                             "--group", "ablated", str(ablated), "--ablation", "held_out", "ablated",
                             "--out", str(out))
    assert rc == 0, err
    doc = json.loads(out.read_text())
    [plain] = doc["held_out"]["after_lift"]["conditions"]
    assert (plain["label"], plain["measured"], plain["lifted"]) == ("libero_goal task 0", 10, 8)
    assert plain["success_given_lifted"]["successes"] == 6
    assert doc["ablated"]["after_lift"]["overall"]["success_given_lifted"]["successes"] == 1
    # all of task 0's successes lifted the bowl, so the overall test and the lifted-only one differ in trials
    assert doc["ablation_test"]["pooled"]["a"]["trials"] == 10
    lifted = doc["ablation_test_lifted"]["pooled"]
    assert (lifted["a"]["trials"], lifted["b"]["trials"]) == (8, 8)
    assert lifted["p_worse"] == pytest.approx(261 / 12870, rel=1e-9)
    assert "reached the goal after lifting the object: libero_goal task 0 6/8; all 75.0%" in printed
    assert "ablation test among episodes that lifted the object" in printed


def test_without_lift_measurements_there_is_no_lifted_test(runs, tmp_path) -> None:
    out = tmp_path / "report.json"
    rc, printed, err = _main("toolkits/eval/success_report.py", "--group", "held_out", str(runs["instructed"]),
                             "--group", "ablated", str(runs["ablated"]), "--ablation", "held_out", "ablated",
                             "--out", str(out))
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert "ablation_test_lifted" not in doc and doc["held_out"]["after_lift"]["overall"]["measured"] == 0
    assert "after lifting" not in printed
