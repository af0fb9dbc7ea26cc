"""The scripted policy on libero_goal's kitchen scene: the pick-and-place goals it supports are recorded with
the real simulator (success from its ``check_success``), the one behind a closed drawer is skipped, with
the reason. One init state per task keeps it to a couple of minutes on two cores."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rlinf_cosmos3.demos.scripted_policy import ScriptedPickPlace, UnsupportedTaskError, parse_goal
from rlinf_cosmos3.paths import REPO_ROOT

CLI = REPO_ROOT / "toolkits" / "libero" / "record_demos.py"


def test_goals_behind_a_drawer_or_door_are_refused_before_any_step() -> None:
    """libero_goal task 3 ('open the top drawer and put the bowl inside') is a single ``in`` predicate, but
    its region is inside the closed drawer; a basket's region (libero_object) is not."""
    with pytest.raises(UnsupportedTaskError, match="opened first"):
        ScriptedPickPlace([["In", "akita_black_bowl_1", "wooden_cabinet_1_top_region"]])
    with pytest.raises(UnsupportedTaskError, match="opened first"):
        parse_goal([["In", "bowl_1", "microwave_1_heating_region"]])
    assert parse_goal([["In", "ketchup_1", "basket_1_contain_region"]]).target == "basket_1_contain_region"
    assert parse_goal([["On", "plate_1", "main_table_stove_front_region"]]).obj == "plate_1"


@pytest.mark.slow
@pytest.mark.libero
def test_libero_goal_targets_are_recorded_and_succeed(tmp_path) -> None:
    """Init state 1 of: task 1 (bowl on the stove's cook region), 5 (plate lifted by its rim onto the region
    in front of the stove), 8 (bowl on the plate beside the cabinet: a grasp whose hand fits there) and 9
    (wine bottle on the rack); task 3 is skipped. Every episode kept, each labelled with its instruction."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    spec = importlib.util.spec_from_file_location("record_demos_cli", CLI)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out, summary = tmp_path / "goal", tmp_path / "summary.json"
    rc = cli.main(["--suite", "libero_goal", "--task-ids", "1,3,5,8,9", "--init-states", "1,", "--num-envs", "2",
                   "--camera-storage", "image", "--out", str(out), "--repo-id", "local/goal", "--no-progress",
                   "--summary-json", str(summary)])
    assert rc == 0
    episodes = {e["task_id"]: e for e in json.loads(summary.read_text())["episodes"]}
    assert "opened first" in episodes[3]["skipped"]
    instructions = {1: "put the bowl on the stove", 5: "push the plate to the front of the stove",
                    8: "put the bowl on the plate", 9: "put the wine bottle on the rack"}
    for task_id in instructions:
        assert episodes[task_id]["success"] is True, episodes[task_id]
    dataset = LeRobotDataset("local/goal", root=out)
    meta = dataset.meta.episodes
    assert sorted(meta["task_id"]) == sorted(instructions) and all(meta["success"])
    for row in range(dataset.num_episodes):
        first = dataset[int(meta["dataset_from_index"][row])]
        assert first["task"] == instructions[int(meta["task_id"][row])]
