"""How a release's or a checkout's venv is derived, without building one: the requirements
read from a wheel's own metadata, the versions a checkout is given, and the one-line refusals
of what cannot be built."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from invariants.targets.sglang_scheduler.checkout import (
    declared_requirements,
    nearest_release,
    overlay,
    scm_version,
    source_root,
)
from invariants.targets.sglang_scheduler.requirements import (
    TORCH,
    cpu_requirements,
    dropped,
    wheel_requires,
)
from invariants.targets.sglang_scheduler.venvs import BuildError, checked_release

DECLARED = [
    "aiohttp",
    "torch==2.11.0",
    "flashinfer_python==0.6.8.post1",
    "sgl-deep-gemm==0.1.5",
    "transformers==5.6.0",
    "xgrammar==0.2.1",
    'decord2; sys_platform == "linux" and platform_machine == "aarch64"',
    'pytest; extra == "test"',
    "torchvision",
    "nvidia-ml-py",
]


def test_a_release_keeps_its_own_pins_and_drops_what_only_runs_on_a_gpu():
    """The CPU torch first; every pure-Python pin as the wheel declares it; CUDA kernels,
    torch's companions, other platforms' and extras' requirements left out."""
    chosen = cpu_requirements(DECLARED)
    assert chosen == [TORCH, "aiohttp", "transformers==5.6.0", "xgrammar==0.2.1", "nvidia-ml-py"]
    why = dropped(DECLARED)
    assert set(why) == {"torch", "flashinfer_python", "sgl-deep-gemm", "torchvision"}
    assert TORCH in why["torch"] and "CUDA" in why["flashinfer_python"]


def test_requirements_are_read_from_the_wheels_metadata(tmp_path: Path):
    wheel = tmp_path / "sglang-0.5.99-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        lines = "".join(f"Requires-Dist: {r}\n" for r in DECLARED[:3])
        archive.writestr("sglang-0.5.99.dist-info/METADATA", f"Name: sglang\n{lines}\nbody\n")
    assert wheel_requires(wheel) == DECLARED[:3]


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("0.5.9", "older than 0.5.10"),
        ("0.5.24.dev3", "not a release; build a checkout"),
        ("latest", "not a version"),
    ],
)
def test_a_release_that_cannot_be_built_is_refused_in_one_line(version: str, said: str):
    with pytest.raises(BuildError, match=said) as refused:
        checked_release(version)
    assert "\n" not in str(refused.value)


def test_a_checkout_is_versioned_as_setuptools_scm_does():
    """Five commits past v0.5.23 is 0.5.24.dev5+g<sha>, which sits below 0.5.24: its
    nearest release is 0.5.23; a tagged commit is that release."""
    assert scm_version("v0.5.23-5-g1a2b3c4") == "0.5.24.dev5+g1a2b3c4"
    assert scm_version("v0.5.10.post1-0-gabcdef0") == "0.5.10.post1"
    releases = ["0.5.10", "0.5.22", "0.5.23", "0.5.24"]
    assert nearest_release("0.5.24.dev5+g1a2b3c4", releases) == "0.5.23"
    assert nearest_release("0.5.23", releases) == "0.5.23"
    with pytest.raises(BuildError, match="older than"):
        nearest_release("0.5.9", releases)
    with pytest.raises(BuildError, match="not a v<version> tag"):
        scm_version("nightly-3-gabc")


def test_a_path_that_is_not_a_checkout_is_refused(tmp_path: Path):
    with pytest.raises(BuildError, match="not an SGLang checkout") as refused:
        source_root(tmp_path)
    assert str(tmp_path) in str(refused.value)


def test_a_clone_and_a_source_tree_are_both_checkouts(tmp_path: Path):
    """A clone holds ``python/``; a release's source tree is that folder itself."""
    clone = tmp_path / "clone" / "python"
    (clone / "sglang").mkdir(parents=True)
    (clone / "sglang" / "__init__.py").write_text("")
    (clone / "pyproject.toml").write_text('[project]\nname = "sglang"\ndependencies = ["numpy"]\n')
    assert source_root(tmp_path / "clone") == clone == source_root(clone)
    assert declared_requirements(clone) == ["numpy"]


def test_the_overlay_replaces_the_package_and_writes_the_checkouts_version(tmp_path: Path):
    """Installed over a release: the checkout's modules replace the release's (none of the
    release's Python left behind), and ``sglang/_version.py`` says the checkout's version."""
    root, site = tmp_path / "src", tmp_path / "site"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "mine.py").write_text("X = 1\n")
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "stale.py").write_text("")
    overlay(root, site, "0.5.24.dev5+g1a2b3c4")
    assert sorted(p.name for p in (site / "sglang").iterdir()) == ["_version.py", "mine.py"]
    namespace: dict = {}
    exec((site / "sglang" / "_version.py").read_text(), namespace)
    assert namespace["__version__"] == "0.5.24.dev5+g1a2b3c4"
    assert namespace["__version_tuple__"] == (0, 5, 24)
