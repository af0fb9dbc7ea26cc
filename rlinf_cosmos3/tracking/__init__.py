"""Run directories, log files, TensorBoard and progress: what a researcher watches during a run."""

from rlinf_cosmos3.tracking.run_dir import RunDir, create_run_dir, setup_run_logging, start_run
from rlinf_cosmos3.tracking.tensorboard import ScalarWriter

__all__ = ["RunDir", "ScalarWriter", "create_run_dir", "setup_run_logging", "start_run"]
