"""The config layer turns YAML mistakes into errors that name the field and the fix."""

from dataclasses import dataclass, field

import pytest
from omegaconf import MISSING, OmegaConf

from rlinf_cosmos3.config import ConfigError, load_structured, require, require_path


@dataclass
class _Optim:
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])


@dataclass
class _Cfg:
    data_path: str = MISSING
    micro_batch_size: int = 4
    optim: _Optim = field(default_factory=_Optim)


def test_valid_config_becomes_typed_instance() -> None:
    cfg = load_structured(_Cfg, OmegaConf.create({"data_path": "/d", "optim": {"lr": "0.5"}}))
    assert isinstance(cfg, _Cfg) and isinstance(cfg.optim, _Optim)
    assert cfg.optim.lr == 0.5 and cfg.micro_batch_size == 4


def test_unknown_key_names_full_path() -> None:
    with pytest.raises(ConfigError) as err:
        load_structured(_Cfg, {"data_path": "/d", "optim": {"learning_rate": 1.0}}, root="actor")
    assert err.value.field == "actor.optim.learning_rate"


def test_wrong_type_names_field() -> None:
    with pytest.raises(ConfigError) as err:
        load_structured(_Cfg, {"data_path": "/d", "micro_batch_size": "eight"})
    assert err.value.field == "micro_batch_size"


def test_missing_mandatory_value() -> None:
    with pytest.raises(ConfigError, match="data_path.*required"):
        load_structured(_Cfg, {}, root="data")


def test_require_and_paths(tmp_path) -> None:
    require(True, "x", "never raised")
    with pytest.raises(ConfigError, match=r"config field 'a.b': bad \(fix: do this\)"):
        require(False, "a.b", "bad", "do this")
    assert require_path(tmp_path, "root", "dataset", is_dir=True) == tmp_path
    with pytest.raises(ConfigError, match="dataset not found"):
        require_path(tmp_path / "nope", "root", "dataset")
    with pytest.raises(ConfigError, match="path is not set"):
        require_path(None, "root", "dataset")
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(ConfigError, match="must be a directory"):
        require_path(tmp_path / "f.json", "root", "dataset", is_dir=True)


def test_config_error_survives_pickling() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ConfigError("a.b", "bad", "fix it")))
    assert (err.field, err.problem, err.fix, str(err)) == ("a.b", "bad", "fix it", "config field 'a.b': bad (fix: fix it)")
