"""What every scheduler's job file is written from (`rlctl slurm`, `rlctl k8s`, `rlctl sky`): the run as `Job`,
and the shell lines each node runs, the same under every scheduler: `rlctl train` on the first start, `rlctl
resume` once the run directory holds a config (a requeued job, a restarted pod, a recovered spot cluster), each with
the node's rank and the rank-0 node's address as its scheduler tells them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import yaml


@dataclass(frozen=True)
class Job:
    """A multi-node run as a job: `train_args` are the `rlctl train` options (without --run-dir and the node
    flags), `run_dir` the run directory as every node sees it, `gpu` the plan's card as NAME-MEMGB ("" on CPU),
    `layout` one line saying what runs where."""

    train_args: tuple[str, ...]
    run_dir: PurePosixPath
    nodes: int
    gpus_per_node: int
    gpu: str
    port: int
    name: str
    layout: str


def first_start_or_resume(job: Job) -> list[str]:
    """Shell lines setting STEP (an array) to `rlctl train ...` on the first start, `rlctl resume RUN` once the run
    directory ($RUN) holds a config.yaml."""
    train = shlex.join(["rlctl", "train", *job.train_args, "--run-dir"])
    return [
        'if [ -f "$RUN/config.yaml" ]; then',
        '  STEP=(rlctl resume "$RUN")',
        "else",
        f'  STEP=({train} "$RUN")',
        "fi",
    ]


class _BlockDumper(yaml.SafeDumper):
    """YAML as a person would write it: a multi-line string (a script) as a literal block, a value used twice
    written twice (no &anchors)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _str)


def dump_yaml(documents: list[dict[str, Any]]) -> str:
    """`documents` as YAML (several separated by ---), keys in the order given, scripts as literal blocks."""
    return yaml.dump_all(documents, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=120)
