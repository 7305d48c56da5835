"""Per-release vLLM venvs (no vLLM needed): a release without a pinned recipe gets the packages
the scheduler path imports in the ranges its own wheel metadata declares (GPU packages never),
and ``--target-version V`` finds ``.vllm-venv-V`` (0.33.0: ``.vllm-venv``); the installed
releases are listed oldest first."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

from invariants.scenarios.matrix import ROOT
from invariants.targets.vllm import adapter

METADATA = """Metadata-Version: 2.1
Name: vllm
Version: 0.25.1
Requires-Dist: pydantic>=2.12.0
Requires-Dist: transformers>=5.5.3
Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0
Requires-Dist: llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "arm64"
Requires-Dist: xgrammar<1.0.0,>=0.2.1
Requires-Dist: torch==2.11.0
Requires-Dist: flashinfer-python==0.6.13
Requires-Dist: apache-tvm-ffi==0.1.9
Requires-Dist: pytest; extra == "test"
"""


def _requirements():
    spec = importlib.util.spec_from_file_location("vllm_req", ROOT / "ci" / "vllm_requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_release_venv_takes_the_ranges_its_wheel_declares(tmp_path: Path) -> None:
    """Each scheduler-path package with the wheel's own range (markers evaluated, extras
    dropped); torch and the GPU kernels never; xgrammar with the tvm-ffi it loads with."""
    wheel = tmp_path / "vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-0.25.1.dist-info/METADATA", METADATA)
    module = _requirements()
    reqs = module.declared(str(wheel))
    with_deps = [module.spec_of(n, reqs) for n in module.WITH_DEPS]
    assert "pydantic>=2.12.0" in with_deps and "transformers>=5.5.3" in with_deps
    assert "fastapi<0.137.0,>=0.133.0" in with_deps and "numpy" in with_deps
    assert not any(n.startswith(("torch", "flashinfer", "pytest")) for n in with_deps)
    assert module.no_deps(reqs) == "xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2"


def test_target_version_picks_the_release_venv(tmp_path: Path, monkeypatch) -> None:
    """``--target-version``: ``.vllm-venv-V``, the default release ``.vllm-venv``; an explicit
    interpreter wins; the stamps name the installed releases, oldest first."""
    monkeypatch.setattr(adapter, "ROOT", tmp_path)
    monkeypatch.delenv(adapter.ENV_VAR, raising=False)
    for venv, release in ((".vllm-venv", "0.33.0"), (".vllm-venv-0.9.2", "0.9.2"),
                          (".vllm-venv-0.29.0", "0.29.0")):  # fmt: skip
        (tmp_path / venv).mkdir()
        (tmp_path / venv / ".installed").write_text(f"vllm=={release} torch==2.13.0 numpy")
    assert adapter.installed_releases() == ["0.9.2", "0.29.0", "0.33.0"]
    assert adapter.vllm_python(None, "0.29.0") == tmp_path / ".vllm-venv-0.29.0" / "bin/python"
    assert adapter.vllm_python(None, "0.33.0") == tmp_path / ".vllm-venv" / "bin/python"
    assert adapter.vllm_python("/x/python", "0.29.0") == Path("/x/python")


@pytest.mark.parametrize("version", ["0.29", "latest"])
def test_a_bad_release_name_is_refused_by_the_venv_script(version: str) -> None:
    """`make vllm-env VLLM_VERSION=...` with something not X.Y.Z: one line, exit 2."""
    import subprocess

    out = subprocess.run(
        ["bash", str(ROOT / "ci" / "vllm_env.sh")],
        env={"VLLM_VERSION": version, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "is not a release (X.Y.Z)" in out.stderr
