"""The ``rollout.model``, ``rollout.sglang`` and ``rollout.embedded`` config sections (``rollout.replay``:
:mod:`rlinf_cosmos3.config.replay`).

The model section holds what must match the trained model (stats file, normalisation method,
fps, frame count, horizon, canvas size, view point, domain): a mismatch with training silently
ruins every action, so the stats file and method have no defaults. The sections' ``validate()`` check
values; :func:`rlinf_cosmos3.validation.rollout.validate_rollout_model` adds what needs the pieces: the
model directory, the training identity the converted model carries (``model_identity.json``,
:mod:`rlinf_cosmos3.models.cosmos3.identity`), the stats file's own fps, chunk length and gripper
metadata, the action domain. ``num_inference_steps``, seed, guidance, flow shift, the gripper command
mode and the rot6d decode are serving choices, not compared with the training. The serving sections
hold only deployment knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rlinf_cosmos3.config.base import PRECISIONS, require, require_one_of
from rlinf_cosmos3.config.libero_suites import ACTION_DIM
from rlinf_cosmos3.config.model_settings import (
    CAPTION_STYLES,
    GRIPPER_CONVENTIONS,
    NORMALIZATIONS,
    NUM_INFERENCE_STEPS,
    RECIPE,
)
from rlinf_cosmos3.paths import sglang_python

RESPONSE_FORMATS = ("raw", "envelope")
ENCODINGS = ("msgpack", "json")
# The VAE compresses time 4x; the action endpoint requires (num_frames - 1) % 4 == 0.
TEMPORAL_COMPRESSION = 4
# Spatial VAE factor (16) times the patch size (2) of Cosmos3's DiT.
CANVAS_MULTIPLE = 16
ROLLOUT_SETTING_KEYS = {
    "fps": "fps", "action_horizon": "num_action_chunks", "num_frames": "num_frames", "canvas_height": "height",
    "canvas_width": "width", "view_point": "view_point", "normalization": "action_normalization",
    "domain_name": "domain_name", "caption_style": "caption_style", "gripper_convention": "gripper_convention",
}
"""Model setting (``config/model_settings.py``) -> the ``rollout.model`` key that sets it: all of them."""
IDENTITY_CONFIG_FIELDS = {**ROLLOUT_SETTING_KEYS, "stats_sha256": "action_stats_path"}
"""Training identity field -> the ``rollout.model`` field that must equal it."""


@dataclass
class RolloutModelConfig:
    """``rollout.model``: which converted model to run and the settings it was trained with."""

    model_path: str = "???"
    """Diffusers Cosmos3 directory (``model_index.json``, ``transformer/``, ``text_tokenizer/``, ...)."""
    action_stats_path: str = "???"
    """Stats JSON used in training (``libero_native_frame_wise_relative_rot6d.json``)."""
    action_normalization: str = "???"
    """Normalisation used in training (``quantile_rot``); required, never guessed."""
    # The model settings this section sets (ROLLOUT_SETTING_KEYS; declared in config/model_settings.py);
    # action_normalization has no default: it must be stated.
    domain_name: str = RECIPE.domain_name
    raw_action_dim: int = 10
    """Model-side width ``[dpos(3), rot6d(6), gripper(1)]``."""
    action_dim: int = ACTION_DIM
    """Env-side width ``[dpos(3), axis-angle(3), gripper(1)]``."""
    num_action_chunks: int = RECIPE.action_horizon
    """Actions per request (the model's action horizon)."""
    num_inference_steps: int = NUM_INFERENCE_STEPS
    """Denoising steps per request: 30, as NVIDIA's LIBERO eval samples (a serving choice, not checked)."""
    num_frames: int = RECIPE.num_frames
    """Must be ``num_action_chunks + 1`` (the conditioning frame plus one per action)."""
    height: int = RECIPE.canvas_height
    width: int = RECIPE.canvas_width
    fps: int = RECIPE.fps
    seed: int = 42
    guidance_scale: float = 1.0
    """1.0 = no classifier-free guidance (SGLang's action default; diffusers' own default is 6.0)."""
    view_point: str = RECIPE.view_point
    """Framing sentence of the action caption; the side-by-side canvas is a ``concat_view``."""
    precision: str = "bf16"
    """dtype of the embedded backend's pipeline (SGLang picks its own)."""
    flow_shift: float = 5.0
    """Shift of the UniPC flow sigmas ``s t / (1 + (s - 1) t)``, sent with every request. 5.0 is what
    NVIDIA's LIBERO eval samples with (cosmos-framework ``generate_samples_from_batch``); without it
    SGLang 0.5.23 shifts action requests by 10.0 and the embedded backend by the model's
    ``scheduler_config.json``."""
    caption_style: str = RECIPE.caption_style
    """Caption the model was trained with: ``diffusers`` or ``cosmos_framework`` (NVIDIA's); compared
    with the model's identity. SGLang cannot send NVIDIA's ``idle_frame`` field (docs/eval.md)."""
    gripper_convention: str = RECIPE.gripper_convention
    """How the training data stored the gripper (``zero_one``, ``pm_one``, ``pm_one_flip``): the
    predicted value is turned into a LIBERO command by it; compared with the model's identity."""
    gripper_command: str = "binary"
    """``binary`` (-1/+1, open only when the prediction says open: RLinf's and the reference's rule)
    or ``continuous`` (the clipped value, what cosmos-framework's eval code sends)."""
    rot6d_decode: str = "svd"
    """``svd`` (cosmos-framework's eval: ``[c0, c1, c0 x c1]`` projected onto SO(3)) or
    ``gram_schmidt`` (RLinf's)."""

    def validate(self, root: str = "rollout.model") -> RolloutModelConfig:
        """Check the values; raises :class:`ConfigError` naming the field. What needs the model directory,
        the stats file or the pieces' tables is :func:`rlinf_cosmos3.validation.rollout.validate_rollout_model`."""
        require(self.action_normalization not in ("", "???"), f"{root}.action_normalization",
                "is required (it must be the method used in training)",
                f"set it explicitly, one of {list(NORMALIZATIONS)}")
        require(self.action_normalization in NORMALIZATIONS, f"{root}.action_normalization",
                f"unknown method '{self.action_normalization}'", f"use one of {list(NORMALIZATIONS)}")
        require(self.flow_shift > 0, f"{root}.flow_shift", f"must be > 0, got {self.flow_shift}",
                "use 5.0 (NVIDIA's LIBERO eval)")
        for name, allowed in (("caption_style", CAPTION_STYLES), ("gripper_convention", GRIPPER_CONVENTIONS)):
            require_one_of(getattr(self, name), allowed, f"{root}.{name}")
        require(self.action_dim == ACTION_DIM, f"{root}.action_dim",
                f"{self.action_dim} but LIBERO takes {ACTION_DIM}-D commands", f"set it to {ACTION_DIM}")
        require(self.num_frames == self.num_action_chunks + 1, f"{root}.num_frames",
                f"{self.num_frames} but must be num_action_chunks + 1 = {self.num_action_chunks + 1}")
        require((self.num_frames - 1) % TEMPORAL_COMPRESSION == 0, f"{root}.num_frames",
                f"num_frames - 1 = {self.num_frames - 1} is not a multiple of {TEMPORAL_COMPRESSION}")
        for name in ("height", "width"):
            value = getattr(self, name)
            require(value > 0 and value % CANVAS_MULTIPLE == 0, f"{root}.{name}",
                    f"must be a positive multiple of {CANVAS_MULTIPLE}, got {value}")
        require(self.num_inference_steps >= 1, f"{root}.num_inference_steps",
                f"must be >= 1, got {self.num_inference_steps}")
        require(self.fps >= 1, f"{root}.fps", f"must be >= 1, got {self.fps}")
        require(self.guidance_scale > 0, f"{root}.guidance_scale", f"must be > 0, got {self.guidance_scale}")
        require(self.precision in PRECISIONS, f"{root}.precision", f"unknown precision '{self.precision}'",
                f"use one of {list(PRECISIONS)}")
        return self

    @property
    def tokenizer_path(self) -> Path:
        return Path(self.model_path) / "text_tokenizer"


def _is_server_url(url: str) -> bool:
    """``http(s)://host:port`` with nothing after the port but an optional ``/``."""
    parts = urlsplit(str(url))
    try:
        port = parts.port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and port is not None \
        and parts.path in ("", "/") and not parts.query


@dataclass
class SGLangConfig:
    """``rollout.sglang``: how many ``sglang serve`` processes, where, and how the client talks to them."""

    num_servers: int = 1
    gpus_per_server: int = 1
    """GPUs per server (CUDA_VISIBLE_DEVICES); 0 runs CPU servers (tests, smoke runs)."""
    gpu_ids: list[int] | None = None
    """Node-local GPU ids to hand out, ``gpus_per_server`` per server; None: the first ones."""
    host: str = "127.0.0.1"
    base_port: int = 30000
    """First port tried; each server takes a block of 4 (HTTP, broker, scheduler, master)."""
    batching_max_size: int = 8
    """Largest batch one request may carry (``--batching-max-size``); the adapter splits at it. 8 is the
    reference eval's ``E / (num_servers * S)`` = 128 / (8 * 2): a stage's observations in one request."""
    max_inflight_per_server: int = 2
    """Requests sent to one server before it has answered (the server queues, it does not merge)."""
    sleep_on_idle: bool = True
    """Without it the idle scheduler spins one CPU core per server."""
    warmup_mode: str = "off"
    health_timeout_s: float = 600.0
    http_timeout_s: float = 600.0
    http_max_retries: int = 5
    http_retry_backoff_s: float = 1.0
    """First retry delay; doubled per attempt, capped at http_retry_backoff_max_s."""
    http_retry_backoff_max_s: float = 30.0
    max_restarts: int = 3
    """Restarts allowed per server before the group gives up."""
    stop_timeout_s: float = 15.0
    """Grace between SIGTERM and SIGKILL of a server's process group."""
    response_format: str = "raw"
    encoding: str = "msgpack"
    extra_server_args: list[str] = field(default_factory=list)
    """Appended verbatim to ``sglang serve`` (e.g. ``["--attention-backend", "torch_sdpa"]``)."""
    python: str | None = None
    """Interpreter of the SGLang environment; None: ``rlinf_cosmos3.paths.sglang_python()``."""
    launch_via_ray: bool = False
    """Start each server from a Ray actor on its GPU node (multi-node) instead of a local subprocess."""
    server_urls: list[str] | None = None
    """Attach to SGLang servers that are already running (``[http://host:port, ...]``) instead of
    launching any: each is health-checked at start, never launched, restarted or stopped by this run,
    and one that stops answering is an error naming its URL. ``num_servers``, the GPU, port and launch
    fields are then unused; ``rollout.model.model_path`` must be the directory the servers serve (its
    training identity is what the eval's settings are checked against)."""

    @property
    def attaches(self) -> bool:
        """True when the run uses servers it did not start (``server_urls``)."""
        return bool(self.server_urls)

    def validate(self, root: str = "rollout.sglang") -> SGLangConfig:
        if self.server_urls is not None:
            urls = list(self.server_urls)
            require(len(urls) > 0, f"{root}.server_urls", "is empty", "leave it null to launch servers")
            bad = [u for u in urls if not _is_server_url(u)]
            require(not bad, f"{root}.server_urls", f"{bad} are not http://host:port URLs",
                    "give each server's base URL, e.g. http://10.0.0.5:30000")
            require(len({u.rstrip('/') for u in urls}) == len(urls), f"{root}.server_urls", f"has duplicates: {urls}",
                    "list each server once")
        require(self.num_servers >= 1, f"{root}.num_servers", f"must be >= 1, got {self.num_servers}")
        require(self.gpus_per_server >= 0, f"{root}.gpus_per_server", f"must be >= 0, got {self.gpus_per_server}",
                "use 0 for CPU servers")
        if self.gpu_ids is not None:
            need = self.num_servers * self.gpus_per_server
            require(len(self.gpu_ids) >= need, f"{root}.gpu_ids",
                    f"{len(self.gpu_ids)} ids for {self.num_servers} servers x {self.gpus_per_server} GPUs = {need}")
            require(len(set(self.gpu_ids)) == len(self.gpu_ids), f"{root}.gpu_ids", f"duplicate ids in {self.gpu_ids}")
        require(self.host.strip() != "", f"{root}.host", "is empty", "use 127.0.0.1 (or 0.0.0.0 for multi-node)")
        require(1024 <= self.base_port <= 65000, f"{root}.base_port", f"must be in [1024, 65000], got {self.base_port}",
                f"set {root}.base_port to an unprivileged port, e.g. 30000; a port in use there is skipped")
        require(self.batching_max_size >= 1, f"{root}.batching_max_size", f"must be >= 1, got {self.batching_max_size}")
        require(self.max_inflight_per_server >= 1, f"{root}.max_inflight_per_server",
                f"must be >= 1, got {self.max_inflight_per_server}")
        for name in ("health_timeout_s", "http_timeout_s", "stop_timeout_s"):
            require(getattr(self, name) > 0, f"{root}.{name}", f"must be > 0, got {getattr(self, name)}")
        require(self.http_max_retries >= 0, f"{root}.http_max_retries", f"must be >= 0, got {self.http_max_retries}")
        require(self.http_retry_backoff_s >= 0, f"{root}.http_retry_backoff_s",
                f"must be >= 0, got {self.http_retry_backoff_s}")
        require(self.http_retry_backoff_max_s >= self.http_retry_backoff_s, f"{root}.http_retry_backoff_max_s",
                f"must be >= http_retry_backoff_s ({self.http_retry_backoff_s}), got {self.http_retry_backoff_max_s}")
        require(self.max_restarts >= 0, f"{root}.max_restarts", f"must be >= 0, got {self.max_restarts}")
        require(self.response_format in RESPONSE_FORMATS, f"{root}.response_format",
                f"unknown format '{self.response_format}'", f"use one of {list(RESPONSE_FORMATS)}")
        require(self.encoding in ENCODINGS, f"{root}.encoding", f"unknown encoding '{self.encoding}'",
                f"use one of {list(ENCODINGS)}")
        if self.attaches:
            return self  # nothing is launched: no SGLang environment needed here
        python = self.interpreter
        require(python.is_file(), f"{root}.python", f"SGLang interpreter not found at '{python}'",
                "run requirements/install.sh or point rollout.sglang.python at the SGLang environment's python")
        require(self.sglang_script.is_file(), f"{root}.python",
                f"no 'sglang' entry point next to '{python}'", "install sglang into that environment")
        return self

    @property
    def interpreter(self) -> Path:
        return Path(self.python) if self.python else sglang_python()

    @property
    def sglang_script(self) -> Path:
        """The ``sglang`` console script of the interpreter's environment."""
        return self.interpreter.parent / "sglang"


@dataclass
class EmbeddedConfig:
    """``rollout.embedded``: the diffusers pipeline in Ray actors instead of SGLang servers."""

    num_workers: int = 1
    gpus_per_worker: int = 1
    """0 runs the pipeline on CPU."""
    cpus_per_worker: float = 1.0
    max_inflight_per_worker: int = 2
    batching_max_size: int = 8
    """Images per request (8, as ``rollout.sglang``) (the adapter splits at it); a worker serves them one pipeline call each."""

    def validate(self, root: str = "rollout.embedded") -> EmbeddedConfig:
        require(self.num_workers >= 1, f"{root}.num_workers", f"must be >= 1, got {self.num_workers}")
        require(self.gpus_per_worker in (0, 1), f"{root}.gpus_per_worker",
                f"must be 0 (CPU) or 1, got {self.gpus_per_worker}", "the pipeline runs on one device")
        require(self.cpus_per_worker > 0, f"{root}.cpus_per_worker", f"must be > 0, got {self.cpus_per_worker}")
        require(self.max_inflight_per_worker >= 1, f"{root}.max_inflight_per_worker",
                f"must be >= 1, got {self.max_inflight_per_worker}")
        require(self.batching_max_size >= 1, f"{root}.batching_max_size", f"must be >= 1, got {self.batching_max_size}")
        return self
