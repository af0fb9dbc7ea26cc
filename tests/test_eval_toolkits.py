"""The eval toolkits on real eval-run files: ``success_report.py`` pools runs and names the failed init
states of each; ``episode_sheet.py`` draws the selected episodes' videos (written by the eval's own
``EpisodeVideoWriter``) a row each."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from rlinf_cosmos3.workers.env.video import EpisodeVideoWriter

REPO = Path(__file__).resolve().parent.parent


def _cli(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem + "_cli", REPO / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _row(trial: int, success: bool, steps: int, video: str | None = None, task: int = 0,
         lift: dict[str, float] | None = None) -> dict:
    row = {"suite": "libero_spatial", "task_id": task, "trial_id": trial, "success_once": success,
           "success_at_end": success, "steps": steps, "video": video, "error": None}
    return row if lift is None else {**row, "object_lift_m": lift}  # runs before the field have none


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_success_report_pools_seeds_and_names_failed_init_states(tmp_path, capsys) -> None:
    bowl = "akita_black_bowl_1"
    seed42 = _run(tmp_path / "seed42", [_row(0, True, 70, lift={bowl: 0.08}), _row(1, False, 220, lift={bowl: 0.004}),
                                        _row(2, False, 220, lift={bowl: 0.09}),
                                        _row(40, True, 80), _row(41, False, 220), _row(3, False, 220, task=1)])
    seed43 = _run(tmp_path / "seed43", [_row(0, False, 220), _row(1, True, 75), _row(2, False, 220), _row(40, True, 90)])
    out = tmp_path / "report.json"
    report = _cli("toolkits/eval/success_report.py")
    assert report.main(["--group", "trained", f"{seed42}:0-39", "--group", "held_out", f"{seed42}:40-49",
                        "--group", "trained", f"{seed43}:0-39", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    trained = doc["trained"]
    assert trained["success_once"]["tasks"]["0"]["successes"] == 2 and trained["success_once"]["tasks"]["0"]["trials"] == 6
    assert trained["success_once"]["overall"]["trials"] == 7  # task 1's episode counts too
    assert [s["failed_init_states"] for s in trained["sources"]] == [{"0": [1, 2], "1": [3]}, {"0": [0, 2]}]
    assert doc["held_out"]["sources"][0]["failed_init_states"] == {"0": [41]}
    # of the failures, those whose object never rose 2 cm (a missed grasp); rows without the field: unknown
    assert [s["failed_never_lifted"] for s in trained["sources"]] == [{"0": [1]}, {}]
    printed = capsys.readouterr().out
    assert "failed, task 0, seed42: [1, 2] (never lifted the object: [1])" in printed
    assert "failed, task 0, seed43: [0, 2]\n" in printed


def _video(path: Path, colour: tuple[int, int, int], steps: int) -> str:
    writer = EpisodeVideoWriter(path, fps=10)
    frames = np.broadcast_to(np.array(colour, dtype=np.uint8), (steps, 32, 32, 3))
    writer.add(frames, frames)
    writer.finish()
    return str(path)


def test_episode_sheet_draws_the_selected_episodes_a_row_each(tmp_path, capsys) -> None:
    run = tmp_path / "20261203-170319-libero_spatial_eval"
    (run / "videos").mkdir(parents=True)
    red = _video(run / "videos" / "t0_i0.mp4", (220, 30, 30), 12)       # a success
    green = _video(run / "videos" / "t0_i1.mp4", (30, 200, 30), 25)     # a failure: frames 0, 10, 20, 24
    blue = _video(tmp_path / "elsewhere" / "t0_i2.mp4", (30, 30, 220), 7)  # a failure stored outside the run
    _run(run, [_row(2, False, 7, blue), _row(0, True, 12, str(Path(red).relative_to(run))),
               _row(1, False, 25, "videos/t0_i1.mp4"), _row(3, False, 220, None)])  # in the order episodes ended
    sheet = _cli("toolkits/eval/episode_sheet.py")
    out = tmp_path / "sheet.png"
    assert sheet.main([str(run), "--every", "10", "--frame-height", "32", "--out", str(out)]) == 0
    assert "2 failures" in (printed := capsys.readouterr().out) and "1 without a video" in printed
    image = np.asarray(Image.open(out).convert("RGB")).astype(int)
    frame_w, row_h, label_w = 64, 32 + 4, sheet.LABEL_WIDTH
    assert image.shape == (2 * row_h, label_w + 4 * (frame_w + 2), 3)

    def colour_at(row: int, column: int) -> np.ndarray:
        return image[row * row_h + 16, label_w + column * (frame_w + 2) + 16]

    assert all(np.abs(colour_at(0, c) - (30, 200, 30)).max() < 40 for c in range(4))  # init state 1 first
    assert np.abs(colour_at(1, 0) - (30, 30, 220)).max() < 40 and np.abs(colour_at(1, 1) - (30, 30, 220)).max() < 40
    assert (colour_at(1, 2) == 255).all()  # init state 2 has 7 steps: frames 0 and 6 only
    assert not (np.abs(image - (220, 30, 30)).max(axis=-1) < 40).any()  # the success is not drawn

    assert sheet.main([str(run), "--select", "successes", "--init-states", "1-3", "--out", str(out)]) == 2
    assert "no successes with a video" in capsys.readouterr().err
    assert sheet.main([str(run), "--every", "0", "--out", str(out)]) == 2
    assert "--every: 0 must be >= 1" in capsys.readouterr().err
    Path(green).unlink()
    assert sheet.main([str(run), "--out", str(tmp_path / "again.png")]) == 2
    assert "t0_i1.mp4 listed in results.jsonl is missing" in capsys.readouterr().err
    assert not (tmp_path / "again.png").exists()
