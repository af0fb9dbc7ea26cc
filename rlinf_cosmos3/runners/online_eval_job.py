"""One online evaluation of an SFT run, in a process of its own: convert a checkpoint, evaluate it, clean up.

The SFT driver (:mod:`rlinf_cosmos3.runners.online_eval`) starts it in a session of its own, so a
crash, an out-of-memory kill or a hang here never reaches training, and stopping its process group
stops its Ray, simulators and policy workers with it. ``check`` composes and validates the eval
config (against the base model and the run's training identity) before training starts::

    python -m rlinf_cosmos3.runners.online_eval_job check --config-name N --base B --stats S --identity F [OVERRIDE ...]
    python -m rlinf_cosmos3.runners.online_eval_job run --config-name N --base B --stats S --checkpoint C \\
        --work W [--use-ema] [--keep-model] [OVERRIDE ...]

``run`` writes the converted model to ``W/model`` (deleted at the end unless ``--keep-model``) and the
eval's run directory under ``W`` (``W/<timestamp>-<config>/summary.json``); its exit code is the
eval's (0 ok, 2 config error, 1 backend did not start), 3 when the conversion failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from rlinf_cosmos3.paths import REPO_ROOT

logger = logging.getLogger("rlinf_cosmos3.online_eval")

EVAL_CONFIG_DIR = REPO_ROOT / "evaluations" / "libero"
CONVERSION_FAILED = 3
PARENT_POLL_S = 1.0
MODEL_DIR = "model"


def forced_overrides(model: str | Path, stats: str | Path, logs_dir: str | Path) -> list[str]:
    """What every online evaluation sets itself (``config.sft.ONLINE_EVAL_FORCED``, in that order)."""
    return ["rollout.rollout_backend=embedded", f"rollout.model.model_path='{model}'",
            f"rollout.model.action_stats_path='{stats}'", f"runner.logs_dir='{logs_dir}'", "runner.resume_dir=null"]


def compose_eval(config_name: str, overrides: Sequence[str]):  # -> DictConfig
    """The eval config Hydra composes from ``evaluations/libero/<config_name>.yaml`` and ``overrides``."""
    from hydra import compose, initialize_config_dir

    from rlinf_cosmos3.config.eval import EvalConfig, register_hydra_schema
    from rlinf_cosmos3.config.hydra_cli import compose_overrides

    register_hydra_schema()
    compose_overrides(EvalConfig, EVAL_CONFIG_DIR, config_name, overrides)  # a rejected override: ConfigError
    with initialize_config_dir(config_dir=str(EVAL_CONFIG_DIR), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def check(args: argparse.Namespace) -> int:
    """Validate the eval config as the runs will use it; exit 2 with the reason on stderr."""
    from rlinf_cosmos3.config import ConfigError
    from rlinf_cosmos3.models.cosmos3.identity import IdentityError, ModelIdentity
    from rlinf_cosmos3.validation.eval import load_eval_config
    from rlinf_cosmos3.validation.rollout import check_identity

    try:
        composed = compose_eval(args.config_name, [*args.overrides, *forced_overrides(args.base, args.stats, "logs")])
        cfg = load_eval_config(composed)
        trained = ModelIdentity.from_json(Path(args.identity).read_text(), source=args.identity)
        check_identity(cfg.rollout.model, "rollout.model", trained=trained)
    except (ConfigError, IdentityError) as err:
        print(err, file=sys.stderr)
        return 2
    return 0


def _follow_parent() -> None:
    """SIGTERM this process once the SFT driver that started it is gone (an evaluation nobody reads is
    stopped through its normal cleanup: servers, simulators, Ray)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        logger.warning("the SFT driver (pid %d) is gone: stopping this evaluation", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="follow-parent", daemon=True).start()


def run(args: argparse.Namespace) -> int:
    """Convert ``--checkpoint`` and evaluate it; the converted model is removed afterwards."""
    from rlinf_cosmos3.checkpoint.export import export_diffusers
    from rlinf_cosmos3.runners.eval_runner import run_eval

    _follow_parent()
    work = Path(args.work)
    model = work / MODEL_DIR
    try:
        try:
            export_diffusers(args.checkpoint, args.base, model, use_ema=args.use_ema, overwrite=True)
        except (OSError, ValueError, KeyError) as err:  # FileNotFound, InsufficientSpace, ConversionError
            logger.error("converting %s failed: %s", args.checkpoint, err)
            return CONVERSION_FAILED
        composed = compose_eval(args.config_name, [*args.overrides, *forced_overrides(model, args.stats, work)])
        return run_eval(composed, config_name=args.config_name)
    finally:
        if not args.keep_model:
            shutil.rmtree(model, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("check", "run"):
        p = sub.add_parser(name)
        p.add_argument("--config-name", required=True, help="an eval config in evaluations/libero/")
        p.add_argument("--base", required=True, help="the diffusers directory the SFT run started from")
        p.add_argument("--stats", required=True, help="the SFT run's action stats file")
        p.add_argument("overrides", nargs="*", help="Hydra overrides of the eval config")
    sub.choices["check"].add_argument("--identity", required=True, help="the run's training identity (JSON)")
    run_parser = sub.choices["run"]
    run_parser.add_argument("--checkpoint", required=True, help="a complete global_step_<N> directory")
    run_parser.add_argument("--work", required=True, help="directory for the converted model and the eval run")
    run_parser.add_argument("--use-ema", action="store_true", help="convert the EMA weights")
    run_parser.add_argument("--keep-model", action="store_true", help="keep the converted model directory")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
