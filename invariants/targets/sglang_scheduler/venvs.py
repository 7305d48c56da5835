"""One CPU venv per SGLang release, each a thin layer over one shared base: ``.sglang-base``
holds the CPU torch wheel and the default release's requirements; ``.sglang-venv-<V>``
(``.sglang-venv`` for the default release) holds the release's wheel and only what its own
requirements (``requirements.py``) need beyond the base. A ``.pth`` file puts the base's
site-packages behind the layer's, so a release's own pins shadow the base's.

Keeps: a stamp (``<venv>/.installed``) is written only after a complete build, and names the
recipe it was built from; a venv whose stamp matches is left alone, a failed build is removed.
Every failure is ``BuildError``: one line naming the release (or the checkout) and what to do.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from packaging.version import InvalidVersion, Version

from invariants.targets.driver import TargetUnavailable
from invariants.targets.sglang_scheduler.requirements import (
    TORCH,
    cpu_requirements,
    gpu_only,
    is_release,
    wheel_requires,
)

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / ".sglang-base"
WHEELS = ROOT / ".sglang-wheels"  # the downloaded release wheels (their metadata is the recipe)
DEFAULT_VERSION = "0.5.23"
OLDEST = "0.5.10"  # the oldest release the scheduler driver has an adapter family for
STAMP = ".installed"
STUBS = ROOT / "invariants" / "targets" / "sglang" / "driver"  # stubs.py: GPU-only imports
LINK = "_kvspec_layers.pth"  # in a layer's site-packages: the site-packages below it
Log = Callable[[str], None]


class BuildError(TargetUnavailable):
    """A release or checkout could not be built (exit 2; nothing is left half-built)."""


def venv_dir(version: str) -> Path:
    """Where a release's venv lives."""
    name = ".sglang-venv" if version == DEFAULT_VERSION else f".sglang-venv-{version}"
    return ROOT / name


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise BuildError(f"{venv}: not a venv (no lib/python3*/site-packages)")
    return found[0]


def checked_release(version: str) -> str:
    """``version`` if it names a release the driver covers, else ``BuildError``."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise BuildError(f"sglang {version!r}: not a version (e.g. 0.5.18)") from None
    if not is_release(version):
        raise BuildError(f"sglang {version}: not a release; build a checkout with --src PATH")
    if parsed < Version(OLDEST):
        raise BuildError(f"sglang {version}: older than {OLDEST}, the oldest release kvspec drives")
    return version


def fetch_wheel(version: str, log: Log) -> Path:
    """The release's wheel, downloaded once into ``.sglang-wheels``."""
    WHEELS.mkdir(exist_ok=True)
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    log(f"downloading sglang {version}")
    cmd = ["pip", "download", "--quiet", "--no-deps", f"sglang=={version}", "-d", str(WHEELS)]
    run = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    if run.returncode or not found:
        raise BuildError(
            f"sglang {version}: not on the package index ({pip_error(run.stderr)}); "
            f"releases are listed by `pip index versions sglang`"
        )
    return found[0]


def pip_error(stderr: str) -> str:
    """pip's own error line, or its last line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["pip failed"])[0].removeprefix("ERROR: ").strip()


def pip(venv: Path, *args: str, what: str) -> None:
    """``python -m pip args`` in ``venv``; ``BuildError`` naming ``what`` when it fails."""
    cmd = [str(python_of(venv)), "-m", "pip", "--disable-pip-version-check", *args]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise BuildError(f"{what}: pip failed: {pip_error(run.stderr)}")


def resolved(venv: Path, requirements: list[str], what: str) -> list[str]:
    """Exact pins of what ``requirements`` need installed in ``venv`` beyond what is there
    (pip's own resolver, dry run), GPU-only packages pulled in by others dropped."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip(venv, "install", "--quiet", "--dry-run", "--report", str(report), *requirements,
            what=what)  # fmt: skip
        items = json.loads(report.read_text())["install"]
    pins = []
    for item in items:
        meta = item["metadata"]
        if not gpu_only(meta["name"]):
            pins.append(f"{meta['name']}=={meta['version']}")
    return pins


def install(venv: Path, requirements: list[str], what: str) -> None:
    """Install ``requirements`` (as resolved) without pulling any GPU-only package."""
    pins = resolved(venv, requirements, what)
    if pins:
        pip(venv, "install", "--quiet", "--no-deps", *pins, what=what)


def up_to_date(venv: Path, recipe: str) -> bool:
    stamp = venv / STAMP
    return python_of(venv).exists() and stamp.exists() and stamp.read_text() == recipe


def fresh_venv(venv: Path, layers: list[Path]) -> None:
    """A new venv at ``venv`` whose site-packages is searched before ``layers``'."""
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    lines = "".join(f"{site_packages(layer)}\n" for layer in layers)
    (site_packages(venv) / LINK).write_text(lines)


def building(venv: Path, recipe: str, build: Callable[[], None]) -> None:
    """Run ``build`` then stamp ``venv``; on any failure remove it (never half-built)."""
    try:
        build()
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    (venv / STAMP).write_text(recipe)


def digest(venv: Path) -> str:
    """A short digest of ``venv``'s recipe (a layer is rebuilt when its base changed)."""
    return hashlib.sha256((venv / STAMP).read_bytes()).hexdigest()[:12]


def ensure_base(log: Log) -> Path:
    """The shared base: the CPU torch wheel and the default release's requirements."""
    requirements = cpu_requirements(wheel_requires(fetch_wheel(DEFAULT_VERSION, log)))
    recipe = " ".join(requirements)
    if up_to_date(BASE, recipe):
        return BASE

    def build() -> None:
        log(f"building {BASE.name} ({TORCH} and sglang {DEFAULT_VERSION}'s requirements)")
        fresh_venv(BASE, [])
        install(BASE, requirements, f"the shared base ({BASE.name})")

    building(BASE, recipe, build)
    return BASE


def build_release(version: str, venv: Path | None = None, log: Log = print) -> Path:
    """The venv of one release (``venv``: another directory), built unless up to date."""
    version = checked_release(version)
    venv = venv or venv_dir(version)
    wheel = fetch_wheel(version, log)
    requirements = cpu_requirements(wheel_requires(wheel))
    base = ensure_base(log)
    recipe = f"sglang=={version} {wheel.name} over {base.name} {digest(base)}: " + " ".join(
        requirements
    )
    if up_to_date(venv, recipe):
        log(f"{venv.name}: sglang {version} up to date")
        return venv

    def build() -> None:
        log(f"building {venv.name}: sglang {version} over {base.name}")
        fresh_venv(venv, [base])
        pip(venv, "install", "--quiet", "--no-deps", str(wheel), what=f"sglang {version}")
        install(venv, requirements, f"sglang {version}'s requirements")
        check_import(venv, version)

    building(venv, recipe, build)
    log(f"{venv.name}: sglang {version} built")
    return venv


def check_import(venv: Path, expected: str) -> None:
    """The venv imports sglang (the drivers' import stubs installed, as they run it) and
    reports ``expected`` as its version."""
    code = (
        f"import sys; sys.path.insert(0, {str(STUBS)!r}); import stubs; stubs.install(); "
        "import sglang; print(sglang.__version__)"
    )
    run = subprocess.run([str(python_of(venv)), "-c", code], capture_output=True, text=True)
    found = run.stdout.strip()
    if run.returncode or found != expected:
        tail = (run.stderr.strip().splitlines() or ["no error"])[-1]
        raise BuildError(f"{venv.name}: sglang does not import as {expected} ({found or tail})")


def index_releases() -> list[str]:
    """Every release from ``OLDEST`` on the package index (``pip index versions sglang``),
    else, offline, those whose wheel was downloaded here; oldest first."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "sglang"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    listed = next((ln for ln in run.stdout.splitlines() if "Available versions:" in ln), "")
    found = [v.strip() for v in listed.partition(":")[2].split(",") if v.strip()]
    if not found:
        found = [w.name.split("-")[1] for w in WHEELS.glob("sglang-*.whl")]
    chosen = {v for v in found if is_release(v) and Version(v) >= Version(OLDEST)}
    return sorted(chosen, key=Version)
