"""What a campaign has seen, on disk as it happens: an append-only journal of JSON lines (a
header saying which campaign it is, then one record per finished run, issued mutant, shrunk
finding or infrastructure error), and atomic writes for every other file (findings' traces,
the report).

Keeps: a kill at any moment — SIGKILL included — loses no record already appended (each line
is flushed and fsynced before the caller goes on) and leaves no half-written file (a write
goes to a temporary file in the same folder, fsynced, then renamed over the old one); a torn
last line, the one a kill can leave, is dropped on reading. Resuming reads the header back,
so ``--resume OUT`` needs no other flag.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any

JOURNAL = "journal.jsonl"
LOCK = ".journal.lock"  # held while a campaign writes the folder: one writer at a time


class JournalError(ValueError):
    """A journal that cannot be resumed (missing, another campaign's) or is being written."""


def lock_folder(out: Path) -> int:
    """An exclusive lock on ``out`` for this process's life (the kernel drops it when the
    process dies, SIGKILL included); ``JournalError`` while another campaign holds it."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalError(
            f"{out}: another campaign is writing there (wait, or use --out)"
        ) from None
    return fd


def write_atomic(path: Path, text: str) -> Path:
    """``text`` into ``path``: all of it or, after a crash, the old file (never a part)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_LOCKS: dict[Path, int] = {}  # folder -> the locked descriptor this process holds


def _lock(out: Path) -> None:
    if out.resolve() not in _LOCKS:
        _LOCKS[out.resolve()] = lock_folder(out)


class Journal:
    """``OUT/journal.jsonl``: ``header`` first, then records (see the module docstring)."""

    def __init__(self, out: Path, header: dict[str, Any], records: list[dict[str, Any]]):
        self.path = out / JOURNAL
        self.header = header
        self.records = records  # what an earlier run of this campaign appended

    @classmethod
    def start(cls, out: Path, header: dict[str, Any]) -> Journal:
        """A fresh journal (an old one in ``out`` is replaced: resume it with ``resume``)."""
        _lock(out)  # before anything is written
        write_atomic(out / JOURNAL, json.dumps({"header": header}) + "\n")
        return cls(out, header, [])

    @classmethod
    def resume(cls, out: Path, kind: str | None = None) -> Journal:
        """The journal in ``out`` (of a campaign of ``kind``: None, any), to continue: its
        records read back, the folder locked for this process."""
        journal = cls.read(out, kind)
        _lock(out)
        return journal

    @classmethod
    def read(cls, out: Path, kind: str | None = None) -> Journal:
        """The journal in ``out`` read back (no lock: a campaign may be writing it)."""
        path = out / JOURNAL
        if not path.is_file():
            raise JournalError(f"--resume {out}: no {JOURNAL} there (nothing to resume)")
        records = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the torn last line of a kill mid-write
        found = records[0].get("header", {}).get("kind") if records else None
        if found is None or kind not in (None, found):
            raise JournalError(f"--resume {out}: {path} is not the journal of a {kind} campaign")
        return cls(out, records[0]["header"], records[1:])

    def release(self) -> None:
        """Let another campaign write the folder (this process's lock on it dropped)."""
        fd = _LOCKS.pop(self.path.parent.resolve(), None)
        if fd is not None:
            os.close(fd)

    def append(self, record: dict[str, Any]) -> None:
        """One record, on disk before this returns."""
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record, separators=(",", ":")) + "\n")
            file.flush()
            os.fsync(file.fileno())

    def of(self, kind: str) -> list[Any]:
        """The earlier records of ``kind``, in the order they were appended."""
        return [r[kind] for r in self.records if kind in r]
