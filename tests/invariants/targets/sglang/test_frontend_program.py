"""SGLang's own frontend drives `kvspec serve`: a ``@sgl.function`` program (multi-turn
``gen`` with ``stop`` strings and ``max_tokens``, ``fork``, ``select`` — a batch of
``max_new_tokens: 0`` requests with prompt logprobs) runs end to end through
``sgl.RuntimeEndpoint`` — its ``/get_model_info`` probe, the sampling parameters it sends
(``stop_regex`` at its neutral value; ``min_tokens`` and the frequency and presence penalties
of one ``gen`` as asked) — and the server ends idle with zero violations and balanced pools."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from engine.server.args import ServerArgs
from invariants.bench.serve import Served
from invariants.targets.sglang.adapter import sglang_python

PROGRAM = Path(__file__).parent / "frontend" / "program.py"


@pytest.mark.sglang
def test_a_frontend_program_runs_end_to_end() -> None:
    with Served(ServerArgs(strict_mem_check=2)) as served:
        done = subprocess.run(
            [str(sglang_python()), str(PROGRAM), served.url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        state = json.loads(done.stdout.strip().splitlines()[-1])
        deadline = time.monotonic() + 20
        while not (report := httpx.get(f"{served.url}/invariants").json())["engine"]["idle"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    answer, meta = state["answer"], state["answer_meta"]
    assert meta["completion_tokens"] <= 16
    if meta["finish_reason"]["type"] == "stop":  # a stop string ended it, trimmed
        assert meta["finish_reason"]["matched"] in ("\n", ".")
        assert not answer.endswith(("\n", "."))
    else:
        assert meta["finish_reason"] == {"type": "length", "length": 16}
    assert state["second_meta"]["completion_tokens"] <= 8
    assert state["penalized_meta"]["finish_reason"] == {"type": "length", "length": 12}
    assert state["text"].startswith("Q: what is a KV cache?\nA:" + answer + "\nQ: and then?\nA:")
    assert state["kind"] in ("radix tree", "hash map", "paged pool")
    scores = state["kind_meta"]["normalized_prompt_logprobs"]
    chosen = ["radix tree", "hash map", "paged pool"][scores.index(max(scores))]
    assert len(scores) == 3 and state["kind"] == chosen
    assert report["healthy"] and report["checker"]["num_violations"] == 0
    assert all(p["balanced"] and p["request_owned"] == 0 for p in report["engine"]["pools"])
