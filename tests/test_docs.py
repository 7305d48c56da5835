"""Everything the code and the docs cite lives in this repository: no reference to files a user
of it does not have (design notes kept elsewhere), every docs/ page named exists, and every
relative link of the README and docs/ resolves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"DESIGN\.md|research/|\.\./shared|aesthetics\.md|verification\.md")
DOC_PAGE = re.compile(r"docs/[\w./-]+\.md")
LINK = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".json", ".txt", "Makefile", "run")


def tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / n for n in names if n.endswith(TEXT) and (ROOT / n).is_file()]


def test_nothing_cites_files_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]}"
        for path in tracked()
        if path.name != "test_docs.py"
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_every_docs_page_named_exists():
    missing = {
        f"{path.relative_to(ROOT)}: {page}"
        for path in tracked()
        for page in DOC_PAGE.findall(path.read_text(errors="replace"))
        if not (ROOT / page).exists()
    }
    assert missing == set()


def test_every_relative_link_of_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)}: {link}"
        for page in pages
        for link in LINK.findall(page.read_text())
        if not (page.parent / link).exists()
    ]
    assert broken == []


def test_the_checks_find_what_they_look_for():
    assert OUTSIDE.search("see research/sglang.md §2") and LINK.findall("[a](b.md#x)") == ["b.md"]
