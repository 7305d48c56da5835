"""SGLang's own streaming-session tests — the release's ``sglang/test`` kits, as its
``test/registered/sessions/test_streaming_session.py`` composes them — against its real HTTP
server on CPU. Only the server launch is kvspec's: the fixture's ``setUpClass`` starts
``launch_server`` with kvspec's fake worker (no gate: the tests' own timing) under the same
environment overrides the fixture applies (SGLang's strict busy check, its KV page
invariants), and a byte tokenizer stands in for the model's (the fake worker's config has
vocab 512: bytes, BOS 256, EOS 257). Every test method runs as SGLang wrote it.

Keeps: a test is passed, failed (its assertion or error, and the server log's SGLang
exception when the scheduler died), or not applicable on CPU with the reason, never skipped
silently. Run by the release's python; prints one JSON line per test. Imports nothing of
kvspec.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import tempfile
import unittest

import launch

sys.path[:0] = list(launch.PATH)
import stubs  # noqa: E402  (the kits import sglang: its triton mock first)

stubs.install()
# SGLang's CI launches its streaming-session servers with these (the fixture's setUpClass)
FIXTURE_ENV = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
    # the kits' model (Llama-3.2-1B-Instruct) has a 131072-token context; the fake worker's
    # config says 8192, so the context the kits count on is granted (SGLang's own knob)
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
}
NOT_APPLICABLE = {
    "test_leak_logprob_concurrent": "the fake worker returns no logits, so no logprobs",
}
FLAGS = {  # a kit's server flag -> the kvspec config key it sets
    "--chunked-prefill-size": "chunked_prefill_size",
    "--context-length": "max_context",
    "--page-size": "page_size",
    "--max-running-requests": "max_running_requests",
}
BASE = {
    "page_size": 1, "pool_tokens": 65_536, "max_reqs": 64,
    "max_running_requests": 48, "chunked_prefill_size": 512, "max_prefill_tokens": 16_384,
    "max_context": 131_072,
    "overlap": True, "mixed_chunk": False, "cache": "radix", "streaming_sessions": True,
    "retract_interval": 0, "seed": 1, "eos_prob": 0.0, "eos_id": 257,
}  # fmt: skip


class ByteTokenizer:
    """kvspec's byte tokenizer, as the kits use a Hugging Face one. It adds no BOS: a server
    run with --skip-tokenizer-init has no tokenizer to strip a turn's BOS by (the kits count
    one only where the tokenizer adds it)."""

    bos_token_id, eos_token_id = 256, 257

    def encode(self, text: str, **_) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, **_) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def config_of(extra_args: list) -> dict:
    """The kit's server flags as the fake worker's configuration."""
    cfg = dict(BASE)
    for flag, value in itertools.pairwise(extra_args):
        if flag in FLAGS:
            cfg[FLAGS[flag]] = int(value)
    cfg["max_reqs"] = max(cfg["max_reqs"], cfg["max_running_requests"])
    return cfg


def kvspec_launch(base):
    """The fixture class with only its launch replaced by kvspec's."""

    class Launched(base):
        @classmethod
        def setUpClass(cls) -> None:
            os.environ.update(FIXTURE_ENV)
            cls.folder = tempfile.mkdtemp(prefix="kvspec-session-tests-")
            cfg = config_of(list(cls.extra_args))
            log = os.path.join(cls.folder, "server.log")
            cls.server = launch.Server(cfg, launch.free_port(), None, log)
            cls.process = cls.server.proc  # the fixture's handle (a kit polls it)
            cls.server.wait_ready(float(os.environ.get("KVSPEC_SERVER_READY_TIMEOUT", "180")))
            cls.base_url = f"http://127.0.0.1:{cls.server.port}"
            cls.tokenizer = ByteTokenizer()

        @classmethod
        def tearDownClass(cls) -> None:
            cls.server.stop()
            shutil.rmtree(cls.folder, ignore_errors=True)

    return Launched


def suites() -> list[tuple[str, type]]:
    """The release's test classes, composed as its test_streaming_session.py composes them
    (the EAGLE variant is not: the server target drives no draft worker)."""
    from sglang.test.kits import streaming_session_kit as kits
    from sglang.test.server_fixtures import streaming_session_fixture as fixture

    base = kvspec_launch(fixture.StreamingSessionServerBase)
    found = [
        (
            "TestStreamingSession",
            compose(base, kits.StreamingSessionKitMixin, ["--chunked-prefill-size", "512"]),
        )
    ]
    if hasattr(kits, "AbortLeakReproKitMixin"):
        args = [
            "--chunked-prefill-size", str(fixture.ABORT_REPRO_CHUNKED_PREFILL_SIZE),
            "--context-length", str(fixture.ABORT_REPRO_CONTEXT_LEN),
            "--page-size", str(fixture.ABORT_REPRO_PAGE_SIZE),
            "--max-running-requests", "32",
        ]  # fmt: skip
        found.append(
            ("TestStreamingSessionAbortLeakRepro", compose(base, kits.AbortLeakReproKitMixin, args))
        )
    return found


def compose(base, kit, extra_args: list) -> type:
    def not_applicable(why):
        def skipped(self):
            raise unittest.SkipTest(f"not applicable on CPU: {why}")

        return skipped

    methods = {
        name: not_applicable(why) for name, why in NOT_APPLICABLE.items() if hasattr(kit, name)
    }
    return type(kit.__name__ + "OnKvspec", (base, kit), {"extra_args": extra_args, **methods})


class Recorded(unittest.TestResult):
    """Each test's outcome, as one JSON line, as it ends."""

    def __init__(self, suite: str) -> None:
        super().__init__()
        self.suite = suite

    def said(self, test, outcome: str, detail: str = "") -> None:
        name = getattr(test, "_testMethodName", str(test))
        print(
            json.dumps(dict(suite=self.suite, test=name, outcome=outcome, detail=detail[-2000:])),
            flush=True,
        )

    def addSuccess(self, test) -> None:
        self.said(test, "passed")

    def addFailure(self, test, err) -> None:
        self.said(test, "failed", self._exc_info_to_string(err, test) + server_died(test))

    def addError(self, test, err) -> None:
        self.said(test, "failed", self._exc_info_to_string(err, test) + server_died(test))

    def addSkip(self, test, reason) -> None:
        self.said(test, "not applicable", reason)


def server_died(test) -> str:
    """SGLang's exception from the server log, when the scheduler died."""
    server = getattr(type(test), "server", None)
    if server is None or server.alive():
        return ""
    import reproducer

    return "\nserver log:\n" + "\n".join(reproducer.crash_lines(server.log_path))


def main() -> None:
    only = set(sys.argv[1:])
    try:
        found = suites()
    except (ImportError, AttributeError) as exc:  # a release from before the kits
        why = f"this release ships no streaming-session kits ({exc})"
        print(json.dumps(dict(suite="-", test="-", outcome="not applicable", detail=why)))
        return
    for name, cls in found:
        tests = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
        if only:
            tests = unittest.TestSuite(t for t in tests if t._testMethodName in only)
        tests.run(Recorded(name))


if __name__ == "__main__":
    main()
