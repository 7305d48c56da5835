"""An SGLang checkout on the real-scheduler target (`make test-sglang`): the README's recipe
for a developer's own code, and a bisect over a clone's commits. No upstream repository is
reachable here, so the checkout is a release's own source distribution (0.5.10.post1's), and
the clone is built from release trees, one commit per release, tagged as SGLang tags them."""

from __future__ import annotations

import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from invariants.checking.loader import shipped_catalog
from invariants.cli import main
from invariants.scenarios.ops import Trace
from invariants.targets.registry import target
from invariants.targets.run import run_trace
from invariants.targets.sglang_scheduler.bisect import bisect_commits
from invariants.targets.sglang_scheduler.releases import SchedulerDriver, installed_versions
from invariants.targets.sglang_scheduler.requirements import wheel_requires
from invariants.targets.sglang_scheduler.venvs import fetch_wheel

pytestmark = pytest.mark.sglang
SCHEDULER = target("sglang-scheduler")
LEAK = Path(__file__).parent / "traces" / "retracted-streaming-turn-leak.json"
LEAKED = {"pool.busy_sum", "census.no_orphans"}  # #22862, as the census says it


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """0.5.10.post1's source distribution, unpacked (its pyproject, PKG-INFO, sglang/)."""
    if "0.5.10.post1" not in installed_versions():
        pytest.skip("sglang 0.5.10.post1: make sglang-env SGLANG_VERSION=0.5.10.post1")
    where = tmp_path_factory.mktemp("sdist")
    cmd = ["pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "sglang==0.5.10.post1"]
    subprocess.run([*cmd, "-d", str(where)], check=True, capture_output=True)
    with tarfile.open(next(where.glob("sglang-*.tar.gz"))) as tar:
        tar.extractall(where, filter="data")
    return where / "sglang-0.5.10.post1"


def test_a_checkout_builds_over_the_nearest_release_and_runs(sdist, capsys):
    """`kvspec sglang env --src PATH` (make sglang-env SGLANG_SRC=PATH) builds the checkout
    over 0.5.10.post1's venv and prints the interpreter to pass; the driver reports the
    checkout's version and finds the release's #22862 leak in it."""
    with pytest.raises(SystemExit) as done:
        main(["sglang", "env", "--src", str(sdist)])
    assert done.value.code in (0, None)
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    python = printed.split("--target-python ")[1].split()[0]
    with SchedulerDriver(python=python) as driver:
        outcome = run_trace(SCHEDULER, Trace.load(LEAK), shipped_catalog(), driver=driver)
        assert driver.version == "0.5.10.post1"
    assert LEAKED <= {v.invariant for v in outcome.violations}


def release_tree(version: str, into: Path) -> None:
    """A release's tree as a clone holds it (``python/``), from its wheel: the Python
    package (no compiled extension: a source tree has none) and its declared requirements."""
    wheel = fetch_wheel(version, log=lambda _: None)
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("sglang/") and not name.endswith(".so"):
                archive.extract(name, into / "python")
    deps = "".join(f"  {json.dumps(r)},\n" for r in wheel_requires(wheel) if "extra ==" not in r)
    project = f'[project]\nname = "sglang"\ndynamic = ["version"]\ndependencies = [\n{deps}]\n'
    (into / "python" / "pyproject.toml").write_text(project)  # a JSON string is a TOML one


def commit(repo: Path, tag: str) -> str:
    git = ["git", "-C", str(repo), "-c", "user.name=kvspec", "-c", "user.email=k@example"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", tag], check=True)
    subprocess.run([*git, "tag", tag], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout


def test_bisect_over_commits_names_the_commit_that_fixed_a_finding(sdist, tmp_path):
    """A clone whose two commits are 0.5.10.post1's tree and 0.5.11's: the leaking trace
    bisected over ``A..B`` says the second commit fixed it (0.5.11's ``_free_tail``), each
    commit built over the nearest installed release."""
    repo = tmp_path / "sglang"
    (repo / "python").mkdir(parents=True)
    subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
    for part in ("sglang", "pyproject.toml", "PKG-INFO"):
        source = sdist / part
        subprocess.run(["cp", "-r", str(source), str(repo / "python" / part)], check=True)
    first = commit(repo, "v0.5.10.post1").strip()
    subprocess.run(["rm", "-rf", str(repo / "python")], check=True)
    release_tree("0.5.11", repo)
    second = commit(repo, "v0.5.11").strip()
    result = bisect_commits(Trace.load(LEAK), repo, f"{first}..{second}", LEAK.name)
    assert result.change == "fixed" and second.startswith(str(result.first))
    assert LEAKED <= set(str(result.key).split("+"))
    assert [s.version for s in result.steps] == ["0.5.10.post1", "0.5.11"]
