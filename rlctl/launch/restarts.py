"""Elastic restarts: torchrun's agent (hardware.max_restarts > 0) restarts every node's training processes after
one failed or a node was lost, and each process runs the runner again, which skips finished stages and resumes the
interrupted one from its last complete checkpoint (rlctl's RL loop and TRL's stages read it on their own). What a
restart was is recorded here, from what each process is told at its start: the agent's restart count
(TORCHELASTIC_RESTART_COUNT) and the node it runs on (RLCTL_NODE_RANK, the scheduler's node rank that `rlctl
train` / `resume` was given: the c10d rendezvous numbers the nodes in its own order). A node whose agent was started
anew (a replacement for a lost one) counts fewer restarts than the agents that survived. A lost node that does not
come back within the rendezvous timeout ends the run, explained (`nodes_missing`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from rlctl import checkpoint, rundir

if TYPE_CHECKING:
    from rlctl.plan import Plan

# what torchrun's elastic agent raises when fewer nodes than the plan's joined the c10d rendezvous in time
RENDEZVOUS_TIMEOUT = "RendezvousTimeoutError"


def nodes_missing(the_plan: Plan, stage: str, log_path: Path) -> str:
    """The paragraph of an elastic run that stopped because a lost node did not come back within the rendezvous
    timeout: how many nodes the plan needs, the stage's last complete checkpoint, and the resume command."""
    hw, run_dir = the_plan.config.hardware, Path(the_plan.run_dir)
    last = checkpoint.last_complete(rundir.RunDir(run_dir).checkpoints(stage)) if stage else None
    start = f"{stage}/checkpoints/{last.name}" if last else "the start of the interrupted stage"
    return (
        f"[red]Training stopped (exit 1):[/] fewer than the plan's {the_plan.layout.nodes} nodes joined the "
        f"rendezvous within hardware.rendezvous_timeout_s={hw.rendezvous_timeout_s} s after a restart: a node was "
        f"lost and none came back in its place. The last complete checkpoint is {escape(start)}. Full log: "
        f"{log_path}. Once every node is up again, run on each: rlctl resume {run_dir} --node-rank R --main-address "
        "HOST:PORT (a scheduler's job script does this when it restarts the job)."
    )


def restart_line(rec: dict) -> str:
    """What `rlctl train` prints for a `restart` event of metrics.jsonl (rich markup)."""
    stage = rec.get("stage", "?")
    lost = ", ".join(map(str, rec.get("lost_nodes") or [])) or "none (a process failed)"
    where = rec.get("resumed_from") or f"the start of {stage}"
    return (
        f"[yellow]restart {rec.get('restart')}[/] (elastic, {escape(str(stage))}): node(s) replaced: {lost}; the "
        f"stage had reached step {rec.get('reached_step')}, every process resumed from {escape(str(where))}."
    )


NODE_ENV = "RLCTL_NODE_RANK"  # set by the launch on every node for its processes
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun's elastic agent
# torch's opt-out of the rendezvous store shared with the workers: with it on (torch 2.13), the rank-0 agent keeps
# the workers' store address of its first round, and a node that joins a later round (the replacement of a lost
# one) waits for an address published only in the first; off, rank 0 publishes one every round
SHARED_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@dataclass(frozen=True)
class ProcessStart:
    """What one training process knows of its start: its node rank and its agent's restart count."""

    node: int
    restarts: int

    @classmethod
    def here(cls) -> ProcessStart:
        return cls(int(os.environ.get(NODE_ENV, "0")), int(os.environ.get(RESTART_ENV, "0")))


def lost_nodes(starts: list[ProcessStart]) -> list[int]:
    """The nodes whose agent counts fewer restarts than the most any counts: started anew, in place of a lost one."""
    most = max(s.restarts for s in starts)
    return sorted({s.node for s in starts if s.restarts < most})


def reached_step(run_dir: Path, stage: str) -> int:
    """The last training step `stage` logged in metrics.jsonl (0: none)."""
    path = rundir.RunDir(run_dir).metrics
    step = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("stage") == stage and "event" not in rec:
            step = rec.get("step", step) if isinstance(rec.get("step"), int) else step
    return step


def record(run_dir: Path, starts: list[ProcessStart], stage: str) -> rundir.Restart | None:
    """The restart these processes' starts show (None: a first start, or a resume every node started anew):
    which nodes were replaced, the step `stage` had reached and the checkpoint it resumes from."""
    restart = max(s.restarts for s in starts)
    if not restart:
        return None
    last = checkpoint.last_complete(rundir.RunDir(run_dir).checkpoints(stage))
    return rundir.Restart(
        restart=restart,
        lost_nodes=lost_nodes(starts),
        stage=stage,
        reached_step=reached_step(run_dir, stage),
        resumed_from=f"{stage}/checkpoints/{last.name}" if last else None,
        time=round(time.time(), 3),
    )
