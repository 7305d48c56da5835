"""The explorer's acceptance test: a bug it was not told about — planted here by patching
one engine function — is found within the default seed budget, shrunk to a much shorter
trace that still fails the same invariant, written as JSON, and reproduced by
`kvspec replay` from that file with the violation, its witness and the state-view diff.

The planted bug: the chunk cache frees an aborted request's committed KV one page short
(page size > 1, a prompt over one page) — so it fires only for seeds whose swarm drew the
chunk cache and a page size above 1, and whose ops abort a request holding over a page.
The run uses one process (``workers=1``): worker processes would not inherit the patch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cache.chunk_cache import ChunkCache
from engine.cache.tree_util import request_row
from engine.request import Req
from invariants.cli import app
from invariants.explore import DEFAULT_SEEDS, explore, failure_key, replay
from invariants.explore.explorer import check_trace
from invariants.scenarios.ops import Trace


def leaky_cache_finished_req(self: ChunkCache, req: Req, is_insert: bool = True) -> None:
    """ChunkCache.cache_finished_req with the planted bug: an aborted request keeps its
    last committed page (never freed, owned by nobody)."""
    aborted = req.finished_reason is not None and req.finished_reason.kind == "abort"
    committed = req.pop_committed_kv_cache()
    short = self.page_size if aborted and self.page_size > 1 and committed > self.page_size else 0
    self.allocator.free(self.req_to_token_pool.read(request_row(req), 0, committed - short))


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ChunkCache, "cache_finished_req", leaky_cache_finished_req)


def test_explorer_finds_shrinks_and_replays_the_planted_bug(planted: None, tmp_path: Path) -> None:
    """Within the default seeds the explorer stops at a failing seed, names an accounting
    invariant, writes a shrunk trace of at most a tenth of the ops (and at most 6) that
    still fails with the same invariant; `kvspec replay` reproduces it (exit 1) and prints
    the witness and the diff of the release that leaked."""
    report = explore(fail_fast=True, out_dir=tmp_path)
    assert report.failed and report.results[-1].seed < DEFAULT_SEEDS
    finding = report.findings[0]
    assert finding.key in ("pool.busy_sum", "census.no_orphans", "pool.idle_sum")
    assert finding.shrunk_ops <= min(6, finding.original_ops // 10)
    shrunk = Trace.load(finding.path)
    assert len(shrunk.ops) == finding.shrunk_ops
    assert failure_key(check_trace(shrunk)) == finding.key

    result = CliRunner().invoke(app, ["replay", str(finding.path)])
    assert result.exit_code == 1, result.output
    assert f"[{finding.key}]" in result.output and "witness:" in result.output
    assert "state diff" in result.output
    diff = replay(shrunk).diff  # the release: request-owned pages gone, not all of them freed
    assert any(line.startswith("  pools[full].request_owned") for line in diff), diff
