"""`rlctl slurm`: a ready sbatch script for a multi-node run.

One task per node runs `rlctl train` (first start) or `rlctl resume` (the run directory already holds a config:
a requeued job), each with its own `--node-rank $SLURM_NODEID` and the first node of the allocation as the
rendezvous address. The run directory must be on a filesystem every node shares. SLURM signals the batch shell
120 s before the time limit or a preemption; the script forwards SIGTERM to the tasks, rlctl saves a checkpoint
at the next step and exits, and the job is requeued to resume.
"""

from __future__ import annotations

import shlex

from rlctl import __version__
from rlctl.launch.jobs import Job, first_start_or_resume

CPUS_PER_GPU = 8


def script(
    job: Job, cpus_per_task: int | None = None, partition: str | None = None, time_limit: str | None = None
) -> str:
    """The sbatch script text."""
    run = str(job.run_dir)
    cpus = cpus_per_task or max(CPUS_PER_GPU * job.gpus_per_node, 2)
    sbatch = [
        f"--job-name={job.name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
    ]
    if job.gpus_per_node:
        sbatch.append(f"--gpus-per-node={job.gpus_per_node}")
    sbatch += [f"--cpus-per-task={cpus}", "--requeue", "--signal=B:TERM@120", f"--output={run}/logs/slurm-%j.out"]
    if partition:
        sbatch.append(f"--partition={partition}")
    if time_limit:
        sbatch.append(f"--time={time_limit}")
    lines = [
        "#!/bin/bash",
        f"# Written by rlctl {__version__}: {job.layout}.",
        "# Submit with: sbatch THIS_FILE. The run directory must be on a filesystem every node shares, and rlctl on",
        "# PATH on every node. A requeued job (preemption, time limit) resumes from the last complete checkpoint.",
        *(f"#SBATCH {option}" for option in sbatch),
        "",
        "set -uo pipefail",
        f"RUN={shlex.quote(run)}",
        'MAIN=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        *first_start_or_resume(job),
        "# one task per node; each takes its rank from SLURM",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        '  bash -c \'exec "$@" --node-rank "$SLURM_NODEID"\' rlctl-node \\',
        f'  "${{STEP[@]}}" --nodes {job.nodes} --main-address "$MAIN:{job.port}" &',
        "SRUN=$!",
        "STOPPED=0",
        "# time limit or preemption: rlctl saves a checkpoint at the next step, then the job is requeued",
        "trap 'STOPPED=1; kill -TERM \"$SRUN\" 2>/dev/null' TERM",
        'wait "$SRUN"; CODE=$?',
        'while [ "$STOPPED" = 1 ] && kill -0 "$SRUN" 2>/dev/null; do wait "$SRUN"; CODE=$?; done',
        'if [ "$STOPPED" = 1 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
        'exit "$CODE"',
    ]
    return "\n".join(lines) + "\n"
