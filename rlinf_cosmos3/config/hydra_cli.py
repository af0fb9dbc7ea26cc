"""Command-line overrides that Hydra rejects, reported as :class:`ConfigError` naming the key.

Hydra composes a config before the task function runs, so an override it cannot apply
(``foo.bar=1`` for a key the typed schema lacks, ``actor.micro_batch_size=abc``, a syntax error)
never reaches the run's own validation: Hydra prints its own message (for an unknown key it even
suggests ``+foo.bar=1``, which the schema rejects as well) and exits with 1. The entry points call
:func:`check_command_line` first: it composes the same config with Hydra's compose API and, when
that fails, logs ``invalid config: config field '<key>': ... (fix: ...)`` and returns exit code 2,
as every other config error does. When composition works, Hydra's own ``@hydra.main`` runs as before.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from rlinf_cosmos3.config.base import ConfigError, unknown_key_error

# Flags after which Hydra does something other than compose and run (help, printing, sweeps):
# the check stays out of their way.
_NON_RUN_FLAGS = ("help", "hydra_help", "cfg", "info", "multirun", "shell_completion", "experimental_rerun",
                  "config_dir")


def check_command_line(schema: type, script_dir: Path, default_config_path: str, default_config_name: str,
                       logger_name: str, argv: Sequence[str] | None = None) -> int | None:
    """Compose the config the command line asks for; exit code 2 (after logging why) if Hydra rejects it.

    Returns ``None`` when the command line composes (or asks Hydra for something other than a run),
    so the caller goes on into ``@hydra.main``.
    """
    # The parser @hydra.main itself uses, so both read the command line the same way.
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if any(getattr(args, flag, None) for flag in _NON_RUN_FLAGS):
        return None
    config_dir = Path(args.config_path or default_config_path)
    config_dir = config_dir if config_dir.is_absolute() else script_dir / config_dir
    try:
        compose_overrides(schema, config_dir, args.config_name or default_config_name, args.overrides)
    except ConfigError as err:
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                                format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger(logger_name).error("invalid config: %s", err)
        return 2
    return None


def compose_overrides(schema: type, config_dir: Path, config_name: str, overrides: Sequence[str]) -> None:
    """Hydra's composition of ``config_name`` with ``overrides``; an override it rejects raises ConfigError."""
    overrides = list(overrides)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            compose(config_name=config_name, overrides=overrides)
    except OverrideParseException as err:
        bad = _unparsable(overrides)
        raise ConfigError(_key(bad) if bad else "<command line>",
                          f"cannot parse the override {bad!r}: {_lines(err)}" if bad else _lines(err),
                          "write overrides as key=value (lists as key=[a,b], strings with spaces in quotes)") from err
    except HydraException as err:  # ConfigCompositionException, MissingConfigException
        raise _composition_error(schema, err, overrides) from err


def _composition_error(schema: type, err: HydraException, overrides: list[str]) -> ConfigError:
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        full_key = str(cause.full_key)
        override = next((o for o in overrides if _key(o) == full_key or _key(o).startswith(full_key + ".")), None)
        dict_override = next((o for o in overrides if _sets_a_dict(o, full_key)), None)
        if dict_override is not None:
            key, _, value = dict_override.partition("=")
            return ConfigError(key, f"Hydra cannot set the dict field with {dict_override!r}: without ++ it merges "
                               "key by key into the schema's empty dict, which takes no new key",
                               f"write '++{key}={value}' (++: set or add)")
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):  # a key the schema does not declare
            return unknown_key_error(schema, full_key, _key(override) if override else full_key,
                                     _lines(cause), given=override)
        if isinstance(cause, ValidationError):
            return ConfigError(full_key, f"{_lines(cause)} (override {override!r})" if override else _lines(cause),
                               f"give {full_key} a value of the type its schema declares")
        return ConfigError(full_key, _lines(cause))
    message = _lines(err)
    override = next((o for o in overrides if f"'{_key(o)}'" in message), None)
    return ConfigError(_key(override) if override else "<command line>", message,
                       "check the override against the config's YAML and rlinf_cosmos3/config/")


def _sets_a_dict(override: str, full_key: str) -> bool:
    """``a.b={k:v}`` (no ``+``) refused at ``a.b.k``: a dict value for a dict field of the schema."""
    key, _, value = override.partition("=")
    return not key.startswith("+") and full_key.rsplit(".", 1)[0] == key and value.lstrip().startswith("{")


def _unparsable(overrides: list[str]) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException:  # OverrideParseException, or the grammar's own HydraException
            return override
    return None


def _key(override: str) -> str:
    """``+a.b=1`` -> ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~")


def _lines(err: BaseException) -> str:
    """The exception's message without OmegaConf's ``full_key:``/``object_type=`` trailer, on one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    keep = [line for line in lines if not line.startswith(("full_key:", "object_type=", "reference_type=", "See https"))]
    return " ".join(keep or lines) or type(err).__name__
