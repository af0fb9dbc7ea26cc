"""Write tests/data/parity_reference.json by running cosmos-framework's and RLinf's own code.

    .venv/bin/python tests/data/make_parity_reference.py \
        --cosmos-framework /path/to/NVIDIA/cosmos-framework.git --rlinf /path/to/RLinf/RLinf.git

Both arguments are git directories (a clone or a bare mirror) that hold the pinned commits below.
Their packages are exported with ``git archive`` into a temporary directory and imported from there;
nothing of theirs is copied into this repository, only the numbers and strings their functions
return, together with the exact inputs. ``tests/test_parity_reference.py`` checks ours against them.

What runs, per section of the JSON file (cosmos-framework at COSMOS_FRAMEWORK_COMMIT):

* ``rot6d``: ``simulation/libero/closed_loop_eval.py::_rotation_repr_to_mat(r6, "6d")`` (their
  ``pose_utils.convert_rotation(..., "rot6d", "matrix", normalize_matrix=True)``) and
  ``_framewise_action_to_delta(a10, "6d")`` on non-orthonormal rot6d vectors: seeded random rotations
  (``numpy.random.default_rng(15)``) perturbed by N(0, 0.002) or N(0, 0.05) noise and scaled, cast to
  float32 (their code computes in float32); the inputs are stored as those float32 values.
* ``gripper``: ``closed_loop_eval._remap_gripper([0]*6 + [g], mode)`` for each convention (the
  continuous command), and for ``zero_one`` RLinf's ``rlinf/envs/action_utils.py::
  prepare_actions_for_libero(actions, "cosmos3")`` (the binarised ``-sign(2g - 1)``; RLinf at
  RLINF_COMMIT).
* ``training_captions``: ``datasets/libero_lerobot_dataset.py::LIBEROLeRobotDataset._build_item`` on a
  hand-made 40-frame episode with idle steps (``DEMO_ACTIONS``, fps 20, chunk 16, concat_view,
  quantile_rot with their bundled stats), on an instance whose index arrays are set by hand and whose
  ``_load_video`` returns zero frames of the real 17 x 3 x 256 x 512 shape (no video files exist);
  every paraphrase of a " | " task is taken in turn by replacing the module's ``random.choice``. The
  sample then goes through ``utils/json_formatter.py::ActionPromptJsonFormatter`` with the
  ``image_size`` that their ``VideoResize`` (reflection padding of 256x512 into the 256-tier 320x192
  canvas) produces, ``[192, 320, 160, 320]`` (``transforms.py`` itself needs ``iopath``, not installed),
  and ``json.dumps`` as their ``TextTokenizerTransform`` does. ``idle_frames`` is the count their
  ``_compute_idle_frames`` gave.
* ``eval_captions``: ``closed_loop_eval._augment_task_prompt_with_viewpoint(task, ["agentview",
  "wrist"])``, then the formatter on the dict ``scripts/action_policy_server_libero.py::
  ActionModelService._build_json_prompt`` builds (viewpoint concat_view, post-pad video
  [3, 17, 192, 320], image_size [192, 320, 160, 320], fps 20, mode wam, a zero [16, 64] action,
  idle_frames 0), then ``json.dumps``. The server module itself needs CUDA and their inference stack.

``cosmos_framework/utils/log.py`` is replaced by a no-op logger in the export (it needs ``loguru``,
which is not installed; only warnings on paths these inputs never take go through it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace

import numpy as np

COSMOS_FRAMEWORK_COMMIT = "5eee9ed574255f017b192161bfbb5a10253d65cf"  # Release 2026-08-21
RLINF_COMMIT = "6ac23065bcd05565b6e9534ec8c2dba4d6051eff"  # "fix: add the cosmos framework download web."
OUT = Path(__file__).with_name("parity_reference.json")

FPS = 20
CHUNK = 16
TASKS = [
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "put both the alphabet soup and the tomato sauce in the basket",
    "open the middle drawer of the cabinet.",
    "  turn on the stove  ",
    "put the bowl on the plate | place the bowl onto the plate | move the bowl to the plate",
]
CHUNK_STARTS = [0, 3, 10, 15, 20, 23]
GRIPPER_VALUES = {
    "zero_one": [-0.2, 0.0, 0.1, 0.3, 0.49, 0.5, 0.51, 0.7, 1.0, 1.3],
    "pm_one": [-1.5, -1.0, -0.6, -0.01, 0.0, 0.01, 0.4, 1.0, 1.2],
    "pm_one_flip": [-1.5, -1.0, -0.6, -0.01, 0.0, 0.01, 0.4, 1.0, 1.2],
}


def demo_actions() -> np.ndarray:
    """A 40-frame LIBERO-like episode (7-D, gripper zero_one) with idle stretches of known lengths."""
    a = np.zeros((40, 7), dtype=np.float32)
    a[:, 6] = 1.0  # open
    a[5:15, 0:3] = [0.3, -0.2, 0.1]  # moving
    a[5:15, 3:6] = [0.01, 0.0, -0.02]
    a[15:19, 0] = 1e-4  # below 5e-3 / 20 = 2.5e-4: still idle
    a[19:, 6] = 0.0  # the gripper closes at frame 19 (a change of 1: not idle)
    a[22, 0:3] = [0.0, 0.05, 0.0]  # one moving frame
    a[26, 5] = 0.002  # above 1.5 deg / 20 = 1.31e-3 rad: breaks the idle run 23..30
    a[31:, 0:3] = [-0.2, 0.0, 0.3]
    return a


def _export(git_dir: Path, commit: str, package: str, dest: Path) -> None:
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", commit, package], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def _rot6d_inputs() -> np.ndarray:
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(15)
    rows = []
    for k in range(12):
        angle = rng.uniform(0.0, np.pi / 8 if k < 6 else np.pi)
        axis = rng.normal(size=3)
        rot = Rotation.from_rotvec(angle * axis / np.linalg.norm(axis)).as_matrix()
        r6 = np.concatenate([rot[:, 0], rot[:, 1]])
        r6 = r6 + rng.normal(scale=0.002 if k % 2 == 0 else 0.05, size=6)
        rows.append(r6 * (1.0 if k % 3 else rng.uniform(0.5, 2.0)))
    return np.asarray(rows, dtype=np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cosmos-framework", type=Path, required=True, help="git dir holding NVIDIA/cosmos-framework")
    parser.add_argument("--rlinf", type=Path, required=True, help="git dir holding RLinf/RLinf")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _export(args.cosmos_framework, COSMOS_FRAMEWORK_COMMIT, "cosmos_framework", root / "cf")
        (root / "cf" / "cosmos_framework" / "utils" / "log.py").write_text(
            "def _noop(*args, **kwargs):\n    pass\n\n\ndebug = info = warning = error = critical = success = _noop\n")
        _export(args.rlinf, RLINF_COMMIT, "rlinf", root / "rlinf")
        sys.path[:0] = [str(root / "cf"), str(root / "rlinf")]
        reference = build(root / "cf")
    reference["sources"] = {"cosmos_framework": {"repository": "NVIDIA/cosmos-framework", "commit": COSMOS_FRAMEWORK_COMMIT},
                            "rlinf": {"repository": "RLinf/RLinf", "commit": RLINF_COMMIT}}
    args.out.write_text(json.dumps(reference, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def build(cf_root: Path) -> dict:
    import torch
    from cosmos_framework.data.generator.action.datasets import libero_lerobot_dataset as lds
    from cosmos_framework.data.generator.action.utils.json_formatter import ActionPromptJsonFormatter
    from cosmos_framework.simulation.libero import closed_loop_eval as cle
    from rlinf.envs.action_utils import prepare_actions_for_libero

    out: dict = {"fps": FPS, "chunk_length": CHUNK}

    # rot6d decode --------------------------------------------------------------------------------
    r6 = _rot6d_inputs()
    a10 = np.concatenate([np.full((len(r6), 3), 0.1, np.float32), r6, np.full((len(r6), 1), 0.7, np.float32)], 1)
    out["rot6d"] = {
        "inputs": r6.astype(np.float64).tolist(),
        "matrices": [cle._rotation_repr_to_mat(v, "6d").astype(np.float64).tolist() for v in r6],
        "actions10": a10.astype(np.float64).tolist(),
        "actions7": [cle._framewise_action_to_delta(v, "6d").astype(np.float64).tolist() for v in a10],
    }

    # gripper -------------------------------------------------------------------------------------
    gripper: dict = {}
    for mode, values in GRIPPER_VALUES.items():
        gripper[mode] = {"values": values,
                         "continuous": [float(cle._remap_gripper([0.0] * 6 + [g], mode)[-1]) for g in values]}
    chunk = np.zeros((1, len(GRIPPER_VALUES["zero_one"]), 7))
    chunk[0, :, 6] = GRIPPER_VALUES["zero_one"]
    gripper["zero_one"]["rlinf_binary"] = prepare_actions_for_libero(chunk, "cosmos3")[0, :, 6].tolist()
    out["gripper"] = gripper

    # training captions ---------------------------------------------------------------------------
    actions = demo_actions()
    ds = object.__new__(lds.LIBEROLeRobotDataset)
    ds.__dict__.update(
        _fps=float(FPS), _chunk_length=CHUNK, _mode="wam", _camera_mode="concat_view", _rotation_space="6d",
        _viewpoint="concat_view", _domain_id=5, _action_normalization="quantile", _norm_stats=None,
        _stats_key="global_raw", _stats_file=cf_root / "cosmos_framework/data/generator/action/normalizer_stats"
        / "libero_native_frame_wise_relative_rot6d.json",
        _valid_cum=np.array([len(actions) - CHUNK], dtype=np.int64), _ep_starts=np.array([0]),
        _ep_vals=np.array([0]), _episodes={0: {}}, _row_timestamp=np.arange(len(actions)) / FPS,
        _row_action=actions, _row_task=np.zeros(len(actions), dtype=np.int64), _tasks={},
    )
    ds._load_video = lambda episode, timestamps: torch.zeros(len(timestamps), 3, 256, 512)
    picks: dict = {"k": 0, "seen": []}

    def choose(seq: list) -> object:  # stands in for random.choice: records the candidates, takes the k-th
        picks["seen"] = list(seq)
        return seq[picks["k"]]

    lds.random = SimpleNamespace(choice=choose)
    formatter = ActionPromptJsonFormatter(caption_key="ai_caption")
    post_pad_size = torch.tensor([192.0, 320.0, 160.0, 320.0])

    training = []
    out["paraphrases"] = {}
    for task in TASKS:
        ds._tasks = {0: task}
        picks["k"] = 0
        ds._build_item(0)
        candidates = out["paraphrases"][task] = picks["seen"]
        for k in range(len(candidates)):
            picks["k"] = k
            for start in CHUNK_STARTS:
                item = ds._build_item(start)
                item["image_size"] = post_pad_size
                caption = formatter(item)["ai_caption"]
                training.append({"task": task, "paraphrase": candidates[k], "start": start,
                                 "idle_frames": int(item["idle_frames"]), "caption": json.dumps(caption)})
    out["demo_actions"] = actions.astype(np.float64).tolist()
    out["training_captions"] = training

    # eval captions -------------------------------------------------------------------------------
    evals = []
    for task in TASKS:
        description = cle._augment_task_prompt_with_viewpoint(task, ["agentview", "wrist"])
        server_dict = {
            "ai_caption": description, "viewpoint": "concat_view", "video": torch.zeros(3, 17, 192, 320, dtype=torch.uint8),
            "image_size": post_pad_size, "conditioning_fps": torch.tensor(FPS, dtype=torch.long), "mode": "wam",
            "action": torch.zeros(CHUNK, 64), "idle_frames": torch.tensor(0, dtype=torch.long),
        }
        evals.append({"task": task, "description": description,
                      "caption": json.dumps(formatter(server_dict)["ai_caption"])})
    out["eval_captions"] = evals
    return out


if __name__ == "__main__":
    sys.exit(main())
