"""Run directories, log files and TensorBoard events land where the docs say."""

import logging

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf_cosmos3.tracking import ScalarWriter, create_run_dir, setup_run_logging


def test_run_dir_log_config_and_events(tmp_path) -> None:
    run = create_run_dir(tmp_path / "logs", "my_cfg", "run_embodiment.log", stamp="20260101-000000")
    again = create_run_dir(tmp_path / "logs", "my_cfg", "run_embodiment.log", stamp="20260101-000000")
    assert run.root.name == "20260101-000000-my_cfg" and again.root.name == "20260101-000000-my_cfg-2"

    setup_run_logging(run)
    logging.getLogger("rlinf_cosmos3.test").info("hello run log")
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert "hello run log" in run.log_file.read_text()

    assert run.save_config({"a": {"b": 1}}).read_text().startswith("a:")

    with ScalarWriter(run.tensorboard, prefix="train") as writer:
        for step in range(3):
            writer.log({"loss": 1.0 / (step + 1)}, step)
    events = EventAccumulator(str(run.tensorboard))
    events.Reload()
    values = [s.value for s in events.Scalars("train/loss")]
    assert values == pytest.approx([1.0, 0.5, 1.0 / 3])
