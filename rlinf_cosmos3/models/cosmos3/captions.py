"""Caption styles: the structured JSON action caption a policy is trained and prompted with.

Two styles, part of a model's identity (a model prompted with a caption it was not trained on
gets out-of-distribution text):

* ``diffusers`` (default): the caption diffusers' ``Cosmos3OmniPipeline._build_action_json_prompt``
  and SGLang's ``build_action_prompt`` build from the task and ``view_point`` -- identical at
  training and evaluation, built by those libraries themselves (this module builds none of it).
* ``cosmos_framework``: NVIDIA's own LIBERO captions (cosmos-framework ``ActionPromptJsonFormatter``),
  for checkpoints trained the NVIDIA way. Training (``LIBEROLeRobotDataset`` + the formatter): the
  framing is the concat_view sentence followed by :data:`LAYOUT_SENTENCE`, the description is one
  ``" | "`` paraphrase of the task, and the action entry carries ``"idle_frame": "N out of 16."``
  (N from :func:`rlinf_cosmos3.actions.count_idle_frames`). Evaluation
  (``simulation/libero/closed_loop_eval.py`` + ``scripts/action_policy_server_libero.py``): the two
  sentences are appended to the *description* instead, the framing is the concat_view sentence
  alone, and ``"idle_frame"`` is ``"0 out of 16."``.

Everything else (time range, duration, fps, resolution, aspect ratio, key order, ``json.dumps``
spacing) is the same in both styles. Importing this module loads only the standard library (diffusers'
resolution bins are read when an aspect ratio is computed).
"""

from __future__ import annotations

import json
import math

from rlinf_cosmos3.config.model_settings import CAPTION_STYLES

CONCAT_VIEW = "concat_view"
CONCAT_VIEW_SENTENCE = "This video contains concatenated views from multiple camera perspectives."
"""cosmos-framework's framing sentence for ``concat_view`` (diffusers and SGLang use the same text)."""
LAYOUT_SENTENCE = "The left half shows the third-person view; the right half shows the wrist-mounted camera."
"""NVIDIA's description of the ``[main | wrist]`` layout (their LIBERO dataset and closed-loop eval)."""
PARAPHRASE_SEPARATOR = " | "
_NAMED_RATIOS = ("1,1", "4,3", "3,4", "16,9", "9,16")


def check_style(style: str) -> None:
    if style not in CAPTION_STYLES:
        raise ValueError(f"unknown caption style {style!r}; use one of {list(CAPTION_STYLES)}")


def paraphrases(task: str) -> list[str]:
    """The task's ``" | "``-separated paraphrases, stripped, empty ones dropped (the task if none)."""
    parts = [part.strip() for part in task.split(PARAPHRASE_SEPARATOR) if part.strip()]
    return parts or [task]


def _sentence(text: str) -> str:
    """Stripped, ending in ``.``, ``!`` or ``?`` (a ``.`` is added otherwise)."""
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def append_sentence(text: str, sentence: str) -> str:
    """``text`` + ``sentence``: skipped if already there; joined by ``" "`` after a ``.``, else ``". "``."""
    if sentence in text:
        return text
    text = text.rstrip()
    if not text:
        return sentence.rstrip()
    return text + (" " if text.endswith(".") else ". ") + sentence.rstrip()


def aspect_ratio(width: int, height: int) -> str:
    """``"W,H"`` of the canvas: the named tier ratio (a 320x192 canvas is ``"16,9"``) or the reduced one.

    Canvases of the resolution tiers (the sizes the model bins images to) carry the name of their tier
    ratio; any other size its ratio reduced by the greatest common divisor.
    """
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS

    if any((width, height) == size for bins in _ACTION_RESOLUTION_BINS.values() for size in bins.values()):
        ratio = width / height
        return min(_NAMED_RATIOS, key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio))
    divisor = math.gcd(width, height)
    return f"{width // divisor},{height // divisor}"


def _caption(framing: str, description: str, idle_frame: str, *, num_frames: int, fps: float, height: int,
             width: int) -> str:
    seconds = num_frames / fps
    minutes, secs = divmod(round(seconds), 60)
    return json.dumps({
        "cinematography": {"framing": framing},
        "actions": [{"time": f"0:00-{minutes}:{secs:02d}", "description": _sentence(description),
                     "idle_frame": idle_frame}],
        "duration": f"{int(seconds)}s",
        "fps": float(fps),
        "resolution": {"H": int(height), "W": int(width)},
        "aspect_ratio": aspect_ratio(int(width), int(height)),
    })


def cosmos_framework_training_caption(description: str, *, idle_frames: int, action_horizon: int, num_frames: int,
                                      fps: float, height: int, width: int) -> str:
    """NVIDIA's LIBERO training caption for one chunk (``description``: the chosen paraphrase)."""
    framing = append_sentence(CONCAT_VIEW_SENTENCE, LAYOUT_SENTENCE)
    return _caption(framing, description, f"{int(idle_frames)} out of {int(action_horizon)}.",
                    num_frames=num_frames, fps=fps, height=height, width=width)


def cosmos_framework_eval_description(task: str) -> str:
    """The description NVIDIA's closed-loop eval sends: the task, then the view and layout sentences."""
    return append_sentence(append_sentence(task, CONCAT_VIEW_SENTENCE), LAYOUT_SENTENCE)


def cosmos_framework_eval_caption(task: str, *, action_horizon: int, num_frames: int, fps: float, height: int,
                                  width: int) -> str:
    """The caption NVIDIA's LIBERO policy server builds for ``task`` (idle frames: 0)."""
    return _caption(CONCAT_VIEW_SENTENCE, cosmos_framework_eval_description(task), f"0 out of {int(action_horizon)}.",
                    num_frames=num_frames, fps=fps, height=height, width=width)


def eval_request_text(style: str, task: str) -> str:
    """What a request carries as the task: the task (``diffusers``) or NVIDIA's eval description."""
    check_style(style)
    return task if style == "diffusers" else cosmos_framework_eval_description(task)
