"""The pre-flight: everything a run needs that can be checked before `accelerate launch`, in seconds and without
loading weights or importing torch/transformers. `rlctl plan` shows it (exit 2 when a check fails) and `rlctl
train` / `rlctl resume` run it again before they launch.

It is a list of checks run in order, each a small function of the state they share (`report.Preflight`) that adds
its line to the report or its error; nothing is raised while they run (`require` raises the errors as one). First
the run's own (`CHECKS`), then, unless the data is generated at launch, the data's (`DATA_CHECKS`):

- the model (`model`): a folder with config.json, a Hub id in the local cache, or a readable GGUF file (converted at
  launch); offline (HF_HUB_OFFLINE) and uncached is refused naming the download command;
- the run directory can be created and written (`model`);
- a vision-language model's family trains the configured stages (`model`, `rlctl.vision`);
- the tools of rl.tools load and can be described to the model (`tools`);
- VAPO's positive-example loss (rl.loss.lm_coef) has a correctness reward in rl.rewards (`tools`);
- model-written code (the code_tests reward, the python tool) can be run in the kernel sandbox, unless
  rl.allow_unconfined_code opts out (`tools`);
- datasets not there yet are shown (`datasets`);
- every dataset is read and its format recognised, with the stage's column mapping (`datasets`);
- every image opens (Pillow), its size giving the image tokens the planner adds (`rlctl.data.images.ImageBudget`),
  and image data goes to a model with a vision tower only (`images`);
- RL rows offer only tools of rl.tools, and the code_tests reward's tests assert something (`tools`);
- the chat template, when any stage's data holds message lists: the tokenizer's own, or `data.chat_template`
  (`datasets`);
- rows over the stage's length limit are counted with the model's tokenizer files (`tokenizers` + jinja2), refused
  when more than `data.max_drop_fraction` would be dropped (`datasets`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlctl.config import RunConfig
from rlctl.launch.preflight import datasets, model, tools
from rlctl.launch.preflight import images as image_checks
from rlctl.launch.preflight.datasets import read_data, readers
from rlctl.launch.preflight.images import check_images, check_resume_images
from rlctl.launch.preflight.model import model_folder, run_dir_problem
from rlctl.launch.preflight.report import Preflight, Report, longest, require, show, show_lengths

__all__ = [
    "CHECKS",
    "DATA_CHECKS",
    "Preflight",
    "Report",
    "check_images",
    "check_resume_images",
    "longest",
    "model_folder",
    "read_data",
    "require",
    "run",
    "run_dir_problem",
    "show",
    "show_lengths",
]

Check = Callable[[Preflight], None]
CHECKS: tuple[Check, ...] = (
    model.check_model,
    model.check_run_dir,
    model.check_vision_stages,
    tools.check_rl_tools,
    tools.check_positive_examples,
    tools.check_sandbox,
    datasets.note_missing_data,
)
DATA_CHECKS: tuple[Check, ...] = (
    datasets.check_datasets,
    image_checks.check_data_images,
    tools.check_rl_rows,
    datasets.check_chat_template,
    datasets.check_tokenizer,
    datasets.check_lengths,
)


def run(
    cfg: RunConfig, run_dir: Path, full: bool = False, paths: dict[str, Path] | None = None, bf16: bool = False
) -> Report:
    """Every check, collected (nothing raised): `full` reads every row (train), else large files are sampled
    (plan); `paths` are the datasets when they are not the config's own (generated data); `bf16` the plan's
    precision (the dtype a GGUF file is converted in). Data generated at launch (data.generate, no `paths`) is
    only named: its checks run when it is generated."""
    state = Preflight(cfg, run_dir, full, paths, bf16)
    for check in CHECKS:
        check(state)
    if cfg.data.generate and paths is None:
        source = f"generated ({cfg.data.generate}, data.generate)"
        state.report.data = {role: {"source": source, "stages": stages} for role, stages in readers(cfg).items()}
        return state.report
    for check in DATA_CHECKS:
        check(state)
    return state.report
