"""Open-loop action error of a converted Cosmos3 policy on recorded demonstration frames.

    .venv/bin/python toolkits/eval/open_loop_error.py --model MODEL_DIR --stats STATS.json \\
        --data DATASET --episodes 0-3 [--frames-per-episode 8] [--steps 30] [--device cuda] [--out err.json]

For frames of the given episodes, the model predicts a 16-step chunk from the frame's two views and the
episode's task (the embedded diffusers pipeline, set up as SGLang serves it), and the chunk goes through
the eval adapter's own conversion (de-normalisation, rot6d -> axis-angle, gripper rule) into LIBERO
commands. These are compared with the commands that were recorded: mean absolute error of the position
and rotation deltas and the share of gripper commands that agree. Beside it, the same errors of a
constant policy that always outputs the mean recorded action of those frames, so "learned" has a
yardstick.
A policy that has learned shows errors well under that baseline on training frames; the gap on held-out
episodes shows how well it generalises. This is the first check when closed-loop success is zero.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm


def command_errors(predicted: np.ndarray, recorded: np.ndarray) -> dict[str, float]:
    """``[..., 7]`` LIBERO commands vs recorded ones: MAE of dpos and drot, gripper agreement."""
    return {
        "dpos_mae": float(np.abs(predicted[..., :3] - recorded[..., :3]).mean()),
        "drot_mae": float(np.abs(predicted[..., 3:6] - recorded[..., 3:6]).mean()),
        "gripper_agreement": float((np.sign(predicted[..., 6]) == np.sign(recorded[..., 6])).mean()),
    }


FLAGS = {"model_path": "--model", "action_stats_path": "--stats", "num_inference_steps": "--steps"}
"""``rollout.model`` field -> the flag that sets it here."""
DATA_FLAGS = {"episodes": "--episodes", "stats_path": "--stats"}
"""``data`` field -> the flag that sets it here (the others follow from --data)."""


def check_model(model_cfg: Any) -> None:
    """The checks evaluation makes before it starts (complete model directory, valid stats file, the model's
    training identity against these settings), with errors naming this tool's flags; ValueError."""
    from rlinf_cosmos3.config import ConfigError
    from rlinf_cosmos3.validation.rollout import check_components, validate_rollout_model

    try:
        validate_rollout_model(model_cfg, "rollout.model")
        check_components(model_cfg, "rollout.model")
    except ConfigError as err:
        name = err.field.rsplit(".", 1)[-1]
        flag = FLAGS.get(name, err.field)
        raise ValueError(f"{flag}: {err.problem}" + (f" (fix: {err.fix})" if err.fix else "")) from err


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rlinf_cosmos3.config import ConfigError
    from rlinf_cosmos3.config.rollout import RolloutModelConfig
    from rlinf_cosmos3.data import LiberoDataConfig, LiberoLeRobotDataset
    from rlinf_cosmos3.data.checks import DatasetMismatchError
    from rlinf_cosmos3.id_lists import parse_id_list
    from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
    from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter

    model_cfg = RolloutModelConfig(model_path=str(args.model), action_stats_path=str(args.stats),
                                   action_normalization="quantile_rot", num_inference_steps=args.steps)
    check_model(model_cfg)
    adapter = Cosmos3ActionAdapter(model_cfg, batching_max_size=1)
    episodes = parse_id_list(args.episodes, "--episodes")
    try:
        # Frames are picked over the whole episode, the padded tail included (its masks drop padded actions).
        data = LiberoLeRobotDataset(LiberoDataConfig(root=str(args.data), repo_id="local/open_loop",
                                                     stats_path=str(args.stats), episodes=episodes,
                                                     complete_chunks_only=False))
    except (ConfigError, DatasetMismatchError) as err:  # the reader names data.* fields: say which flag sets them
        flag = DATA_FLAGS.get(err.field.rsplit(".", 1)[-1], "--data")
        raise ValueError(f"{flag}: {err.problem}" + (f" (fix: {err.fix})" if err.fix else "")) from err
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    policy = Cosmos3Policy.from_pretrained(args.model, device=device, transformer_dtype=dtype)

    by_episode: dict[int, list[int]] = {}
    for row, episode in enumerate(data.episode_indexes()):
        by_episode.setdefault(int(episode), []).append(row)
    picked = [(episode, rows[k]) for episode, rows in sorted(by_episode.items())
              for k in np.linspace(0, len(rows) - 1, num=min(args.frames_per_episode, len(rows))).round().astype(int)]
    rows_out, predicted_all, recorded_all, recorded_normalized = [], [], [], []
    for episode, row in tqdm(picked, desc="open-loop frames", unit="frame", disable=not sys.stderr.isatty()):
        sample = data[row]
        main = sample["image"][0].permute(1, 2, 0).numpy()
        wrist = sample["wrist_image"][0].permute(1, 2, 0).numpy()
        normalized = policy.predict(main, wrist, sample["prompt"], seed=args.seed,
                                    num_inference_steps=args.steps).float().cpu().numpy()
        valid = ~sample["action_is_pad"].numpy()
        predicted = adapter.model_to_env_actions(normalized[:, :10])[valid]
        # The recorded chunk through the same conversion gives back the commands that were sent.
        recorded = adapter.model_to_env_actions(sample["actions"].numpy())[valid]
        predicted_all.append(predicted)
        recorded_all.append(recorded)
        recorded_normalized.append(sample["actions"].numpy()[valid])
        rows_out.append({"episode": episode, "frame": int(sample["frame_index"]),
                         **command_errors(predicted, recorded)})
    predicted_all, recorded_all = np.concatenate(predicted_all), np.concatenate(recorded_all)
    # A constant policy: the mean recorded (normalised) action of these frames, through the same conversion.
    mean_normalized = np.concatenate(recorded_normalized).mean(axis=0)
    baseline = adapter.model_to_env_actions(np.broadcast_to(mean_normalized, (len(recorded_all), 10)))
    return {
        "model": str(args.model), "data": str(args.data), "episodes": episodes, "frames": len(rows_out),
        "inference_steps": args.steps, "seed": args.seed,
        "policy": command_errors(predicted_all, recorded_all),
        "constant_mean_action": command_errors(baseline, recorded_all),
        "per_frame": rows_out,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="converted diffusers directory")
    parser.add_argument("--stats", type=Path, required=True, help="the stats file the model was trained with")
    parser.add_argument("--data", type=Path, required=True, help="LeRobot v3 LIBERO dataset")
    parser.add_argument("--episodes", nargs="+", required=True, help="episode indexes: ids or ranges")
    parser.add_argument("--frames-per-episode", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30, help="inference steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    try:
        report = evaluate(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name in ("policy", "constant_mean_action"):
        e = report[name]
        print(f"{name:<22} dpos MAE {e['dpos_mae']:.4f}  drot MAE {e['drot_mae']:.4f}  "
              f"gripper agreement {e['gripper_agreement']:.1%}  ({report['frames']} frames)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
