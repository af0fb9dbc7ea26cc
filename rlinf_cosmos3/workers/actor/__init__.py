"""The SFT actor: optimizer/schedule/clipping (``optim``), power EMA (``ema``) and the FSDP worker."""

from rlinf_cosmos3.workers.actor.ema import PowerEMA, power_ema_exponent
from rlinf_cosmos3.workers.actor.optim import (
    TrainableSelection,
    build_optimizer,
    build_param_groups,
    clean_param_name,
    clip_grad_norm,
    lambda_linear_factor,
    lambda_linear_schedule,
    select_trainable,
)

__all__ = [
    "PowerEMA",
    "TrainableSelection",
    "build_optimizer",
    "build_param_groups",
    "clean_param_name",
    "clip_grad_norm",
    "lambda_linear_factor",
    "lambda_linear_schedule",
    "power_ema_exponent",
    "select_trainable",
]
