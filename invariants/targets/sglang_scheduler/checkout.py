"""An SGLang checkout as a venv: a developer's clone (or any SGLang source tree) installed
over the venv of the release nearest below it, the way the scheduler target then runs it.

Keeps: the checkout is never written to. Its ``sglang`` package is copied over the nearest
release's (the layer below keeps the release's compiled extensions, which a source tree does
not build without Rust; the Python code that runs is all the checkout's), its version is
written as setuptools-scm would (``0.5.24.dev5+g1a2b3c4`` five commits past ``v0.5.23``), and
its own declared requirements are installed beyond the release's (``requirements.py``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from packaging.version import Version

from invariants.targets.sglang_scheduler.requirements import cpu_requirements, metadata_requires
from invariants.targets.sglang_scheduler.venvs import (
    OLDEST,
    ROOT,
    BuildError,
    Log,
    build_release,
    building,
    fresh_venv,
    install,
    python_of,
    site_packages,
    up_to_date,
)

SUFFIXES = (".so", ".pyd")  # compiled extensions: kept from the release below


def source_root(path: Path) -> Path:
    """The folder holding ``pyproject.toml`` and ``sglang/``: a clone's ``python/`` or a
    source tree itself; ``BuildError`` when ``path`` is neither."""
    for root in (path / "python", path):
        if (root / "sglang" / "__init__.py").exists() and (root / "pyproject.toml").exists():
            return root
    raise BuildError(
        f"{path}: not an SGLang checkout (no python/sglang/ beside a pyproject.toml); "
        "point --src at a clone of sgl-project/sglang"
    )


def checkout_version(root: Path, commit: str = "HEAD") -> str:
    """The version setuptools-scm gives the checkout: from ``git describe`` where it is a git
    clone, else the version its source distribution recorded (PKG-INFO)."""
    described = _git(root, "describe", "--tags", "--long", "--match", "v[0-9]*", commit)
    if described:
        return scm_version(described)
    info = root / "PKG-INFO"
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("Version:"):
                return line.removeprefix("Version:").strip()
    raise BuildError(f"{root}: cannot tell its version (no git tag v* reachable, no PKG-INFO)")


def scm_version(described: str) -> str:
    """``v0.5.23-5-g1a2b3c4`` → ``0.5.24.dev5+g1a2b3c4``; ``v0.5.23-0-g…`` → ``0.5.23``."""
    match = re.fullmatch(r"v(.+)-(\d+)-g([0-9a-f]+)", described)
    if match is None:
        raise BuildError(f"git describe said {described!r}: not a v<version> tag")
    tag, distance, sha = match.groups()
    if distance == "0":
        return tag
    release = list(Version(tag).release)
    release[-1] += 1
    return f"{'.'.join(map(str, release))}.dev{distance}+g{sha}"


def _git(root: Path, *args: str) -> str | None:
    run = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else None


def nearest_release(version: str, releases: list[str]) -> str:
    """The newest of ``releases`` at or below ``version`` (a dev version sits below its
    release: 0.5.24.dev5 → 0.5.23)."""
    below = [r for r in releases if Version(r) <= Version(version)]
    if not below:
        raise BuildError(f"sglang {version}: older than {OLDEST}, the oldest release kvspec drives")
    return max(below, key=Version)


def declared_requirements(root: Path) -> list[str]:
    """The checkout's own requirements: pyproject's static ``dependencies`` (else PKG-INFO)."""
    project = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {})
    if "dependencies" in project:
        return list(project["dependencies"])
    info = root / "PKG-INFO"
    return metadata_requires(info.read_text()) if info.exists() else []


def overlay(root: Path, site: Path, version: str) -> None:
    """Copy the checkout's ``sglang`` over ``site``'s (compiled extensions kept), and write
    its version where ``sglang/version.py`` reads it first (``sglang/_version.py``)."""
    target = site / "sglang"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(root / "sglang", target, ignore=shutil.ignore_patterns("__pycache__"))
    parts = tuple(Version(version).release)
    (target / "_version.py").write_text(
        f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = {parts!r}\n"
    )


def compiled_extensions(release_site: Path, site: Path) -> None:
    """The release's compiled extensions, where the checkout has none of its own."""
    source = release_site / "sglang"
    for lib in (p for p in source.rglob("*") if p.suffix in SUFFIXES):
        dest = site / "sglang" / lib.relative_to(source)
        if dest.parent.exists() and not dest.exists():
            shutil.copy2(lib, dest)


def build_checkout(
    path: Path,
    releases: list[str],
    venv: Path | None = None,
    version: str | None = None,
    log: Log = print,
) -> tuple[Path, str]:
    """The venv of the checkout at ``path`` (``version``: what it is, where ``path`` cannot
    say — a tree taken out of a clone): the nearest of ``releases`` below it, built when
    missing, the checkout over it. Returns (venv, version)."""
    root = source_root(path.resolve())
    version = version or checkout_version(root)
    release = nearest_release(version, releases)
    release_venv = build_release(release, log=log)
    venv = venv or ROOT / f".sglang-venv-src-{re.sub(r'[^A-Za-z0-9]+', '-', path.name)}"
    requirements = cpu_requirements(declared_requirements(root))
    recipe = f"checkout over sglang {release}: {' '.join(requirements)}"
    if not up_to_date(venv, recipe):
        layers = [release_venv, *_layers_below(release_venv)]

        def build() -> None:
            log(f"building {venv.name}: the checkout over sglang {release}")
            fresh_venv(venv, layers)
            install(venv, requirements, f"{root}'s requirements")

        building(venv, recipe, build)
    site = site_packages(venv)
    overlay(root, site, version)
    compiled_extensions(site_packages(release_venv), site)
    log(f"{venv.name}: sglang {version} (the checkout at {path}) over sglang {release}")
    return venv, version


def _layers_below(venv: Path) -> list[Path]:
    """The venvs a layer's ``.pth`` names (a .pth in a named folder is not read: list them)."""
    link = site_packages(venv) / "_kvspec_layers.pth"
    lines = link.read_text().split() if link.exists() else []
    return [Path(line).parents[2] for line in lines]


def checkout_python(venv: Path) -> Path:
    return python_of(venv)
