"""The plan: everything `rlctl train` will do, decided before anything starts and without importing torch.

Owns: hardware specs and detection (`hardware`), the architecture the plan is for (`arch`), the memory model
and the search over layouts it drives (the subpackage `memory`), the generation-engine choice (`engine`),
optional packages a layout needs (`packages`), and the assembled `Plan` (`resolved`, its typed parts in `parts`)
with the run directory's layout (`planner`).
May import: base, vision, config, sandbox, rundir, data.
"""

from rlctl.plan.planner import (
    base_model,
    build,
    data_paths,
    final_policy,
    launch_command,
    missing_data,
)
from rlctl.plan.resolved import Plan, StagePlan

__all__ = [
    "Plan",
    "StagePlan",
    "base_model",
    "build",
    "data_paths",
    "final_policy",
    "launch_command",
    "missing_data",
]
