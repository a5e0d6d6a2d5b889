"""The pre-flight's checks of the model and the run directory: the model can be had (a folder with config.json, a Hub
id in the local cache, a readable GGUF file), the run directory can be made and written, and a vision-language
model's family trains the configured stages."""

from __future__ import annotations

import os
from pathlib import Path

from rlctl.config import ModelConfig
from rlctl.errors import UserError
from rlctl.launch.preflight.report import Preflight
from rlctl.plan import arch as model_arch
from rlctl.plan import gguf


def _looks_local(name: str) -> bool:
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") != 1


def model_folder(model: ModelConfig, bf16: bool = False) -> tuple[Path | None, str]:
    """(the folder holding the model's config and tokenizer files, where it is); (None, why) when it is not here
    yet (a Hub id downloaded at launch, a GGUF file converted at launch). A UserError when it cannot be had."""
    name = model.name_or_path
    if gguf.is_gguf(model):
        spec, _ = gguf.plan_import(model, bf16)
        return (Path(spec.folder) if spec.cached else None), spec.describe()
    if name in model_arch.BUILTIN_MODELS:
        return None, f"{name}, built into the run directory at launch"
    folder = Path(name).expanduser()
    if _looks_local(name):
        if not folder.is_dir():
            raise UserError(
                f"model.name_or_path={name}: no such folder (a Hub model id is written owner/name). Point it at a "
                "folder holding the model's config.json and weights."
            )
        if not (folder / "config.json").is_file():
            raise UserError(f"model.name_or_path={name}: {folder} has no config.json, so it is not a model folder.")
        return folder, f"folder {folder}"
    cached = model_arch.cached_config(name)
    if cached is not None:
        return cached.parent, f"Hugging Face cache ({cached.parent})"
    if model_arch.offline():
        raise UserError(
            f"model.name_or_path={name} is not in the local Hugging Face cache ({model_arch.hub_cache()}) and "
            f"HF_HUB_OFFLINE is set, so it cannot be downloaded. Download it on a machine with network access "
            f"into the same cache: `hf download {name}` (HF_HOME / HF_HUB_CACHE as here), or point "
            "model.name_or_path at a local folder."
        )
    return None, f"Hub id {name}, not in the local cache: downloaded when training starts"


def run_dir_problem(run_dir: Path) -> str | None:
    """Why the run directory cannot be created and written, or None."""
    probe = Path(run_dir).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"--run-dir {run_dir}: {probe} is a file, so no run directory can be made there; pick another --run-dir."
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"--run-dir {run_dir}: {probe} is not writable by this user; pick a folder you can write."
    return None


def check_model(p: Preflight) -> None:
    """The model can be had (`model_folder`); its folder, once here, is where the chat template and the tokenizer
    are read from."""
    try:
        p.folder, where = model_folder(p.cfg.model, p.bf16)
        p.report.checks["model"] = where
    except UserError as e:
        p.report.errors.append(str(e))


def check_run_dir(p: Preflight) -> None:
    """The run directory can be created and written (`run_dir_problem`)."""
    problem = run_dir_problem(p.run_dir)
    p.report.checks["run directory"] = problem or f"{p.run_dir} can be written"
    if problem:
        p.report.errors.append(problem)


def check_vision_stages(p: Preflight) -> None:
    """A vision-language model's family trains every configured stage (`rlctl.plan.arch.vision_stages_problem`)."""
    if (problem := model_arch.vision_stages_problem(p.cfg)) is not None:
        p.report.errors.append(problem)
