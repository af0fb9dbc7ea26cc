"""Action conventions: rotation maths, 7<->10-D conversion, gripper rules, idle frames, normalisation, stats.

The conventions and where they come from are written up in docs/action_conventions.md.
"""

from rlinf_cosmos3.actions.conversion import actions_7_to_10, actions_10_to_7
from rlinf_cosmos3.actions.decoding import EnvActionDecoder
from rlinf_cosmos3.actions.encoding import encode_model_actions
from rlinf_cosmos3.actions.gripper import (
    GRIPPER_COMMANDS,
    GRIPPER_CONVENTIONS,
    dataset_gripper_to_libero_command,
    gripper_range_problem,
    libero_command_to_dataset_gripper,
)
from rlinf_cosmos3.actions.idle import count_idle_frames, idle_steps
from rlinf_cosmos3.actions.normalization import ActionNormalizer, quantile_denormalize, quantile_normalize
from rlinf_cosmos3.actions.rotation import (
    ROT6D_DECODES,
    axis_angle_to_matrix,
    axis_angle_to_rot6d,
    matrix_to_axis_angle,
    matrix_to_rot6d,
    quat_xyzw_to_axis_angle,
    rot6d_to_axis_angle,
    rot6d_to_matrix,
)
from rlinf_cosmos3.actions.stats import (
    STAT_FIELDS,
    STATS_FILENAME,
    ActionStatsError,
    EpisodeActions,
    compute_action_stats,
    load_action_stats,
    read_lerobot_episode_actions,
    validate_action_stats,
    write_action_stats,
)

__all__ = [
    "GRIPPER_COMMANDS",
    "GRIPPER_CONVENTIONS",
    "ROT6D_DECODES",
    "STATS_FILENAME",
    "STAT_FIELDS",
    "ActionNormalizer",
    "ActionStatsError",
    "EnvActionDecoder",
    "EpisodeActions",
    "actions_10_to_7",
    "actions_7_to_10",
    "axis_angle_to_matrix",
    "axis_angle_to_rot6d",
    "compute_action_stats",
    "count_idle_frames",
    "dataset_gripper_to_libero_command",
    "encode_model_actions",
    "gripper_range_problem",
    "idle_steps",
    "libero_command_to_dataset_gripper",
    "load_action_stats",
    "matrix_to_axis_angle",
    "matrix_to_rot6d",
    "quantile_denormalize",
    "quantile_normalize",
    "quat_xyzw_to_axis_angle",
    "read_lerobot_episode_actions",
    "rot6d_to_axis_angle",
    "rot6d_to_matrix",
    "validate_action_stats",
    "write_action_stats",
]
