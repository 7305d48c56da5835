"""The sglang-server target's pure parts, without sglang: the context-token model (a session
turn's answer equals a fresh request's over the same context, a KV mix-up changes it), the
trace's ops as HTTP calls, the server's flags, the HTTP answers as response views, the
reproducer's rounds, and the kvspec side (what the target refuses, the disconnect op)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from invariants.scenarios.ops import Disconnect, Step, Submit, Trace
from invariants.scenarios.spec import EngineSpec
from invariants.targets.ops import op_message
from invariants.targets.sglang_server import adapter

TARGETS = Path(__file__).resolve().parents[4] / "invariants" / "targets"
PATHS = [str(TARGETS / d / "driver") for d in ("sglang_server", "sglang_scheduler", "sglang")]
MODULES = ("context_tokens", "client", "launch", "responses", "reproducer")
CFG = {
    "page_size": 4, "pool_tokens": 256, "max_reqs": 4, "max_context": 128,
    "max_running_requests": 4, "chunked_prefill_size": 64, "max_prefill_tokens": 1024,
    "overlap": True, "mixed_chunk": False, "cache": "radix", "streaming_sessions": True,
    "retract_interval": 0, "seed": 7, "eos_prob": 0.0, "eos_id": 257,
}  # fmt: skip


@pytest.fixture(scope="module")
def driver() -> Iterator[SimpleNamespace]:
    """The driver's modules, imported as the driver imports them (no sglang needed)."""
    sys.path[:0] = PATHS
    try:
        yield SimpleNamespace(**{m: importlib.import_module(m) for m in MODULES})
    finally:
        del sys.path[: len(PATHS)]
        for name in (*MODULES, "worker", "reader", "records"):
            sys.modules.pop(name, None)


class Mode:
    def __init__(self, extend: bool) -> None:
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


def fake_worker(rows: int = 4, width: int = 64) -> SimpleNamespace:
    table = torch.zeros(rows, width, dtype=torch.int32)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=table))
    return SimpleNamespace(model_runner=runner, forwards=0, make_result=lambda ids: ids.tolist())


def run(tokens, worker, slots: list[int], new: int, row: int = 0) -> list[int]:
    """A request over ``tokens`` in ``row`` whose KV sits in ``slots``: one extend, then
    decodes, as SGLang's batches hand them to the worker; its output tokens."""
    table = worker.model_runner.req_to_token_pool.req_to_token
    table[row, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    fed, out, length = list(tokens), [], len(tokens)
    for step in range(new):
        extend = step == 0
        count = length if extend else 1
        batch = SimpleNamespace(
            forward_mode=Mode(extend), seq_lens=torch.tensor([length]),
            input_ids=torch.tensor(fed[-count:]), req_pool_indices=torch.tensor([row]),
            out_cache_loc=torch.tensor(slots[length - count : length]),
            extend_seq_lens=[count],
        )  # fmt: skip
        token = worker.forward_batch_generation(batch)[0]
        out.append(token)
        fed.append(token)
        length += 1
    return out


def test_the_answer_is_the_uncached_reference_wherever_the_kv_lives(driver) -> None:
    """The next token is a function of the attended KV: the same context in other slots gives
    the same tokens, which are the reference computed from the token list alone."""
    tokens = [5, 6, 7, 8, 9, 10]
    one, two = fake_worker(), fake_worker()
    driver.context_tokens.ContextTokens(one, torch.zeros(256, dtype=torch.int64), CFG)
    driver.context_tokens.ContextTokens(two, torch.zeros(256, dtype=torch.int64), CFG)
    first = run(tokens, one, list(range(10, 20)), 4)
    second = run(tokens, two, list(range(100, 110)), 4, row=2)
    reference = driver.context_tokens.reference(7, tokens, 4, (257, 0.0))
    assert first == second == reference
    assert driver.context_tokens.reference(8, tokens, 4, (257, 0.0)) != reference  # the seed


def test_a_kv_mix_up_shows_in_the_answer(driver) -> None:
    """A request whose row names a slot another request wrote answers differently."""
    worker, slots = fake_worker(), torch.zeros(256, dtype=torch.int64)
    driver.context_tokens.ContextTokens(worker, slots, CFG)
    run([50, 51, 52, 53], worker, [30, 31, 32, 33, 34], 1, row=1)  # another request: slots 30..
    tokens = [5, 6, 7, 8, 9, 10]
    table = worker.model_runner.req_to_token_pool.req_to_token
    honest = run(tokens, worker, list(range(10, 20)), 1)
    table[0, 2] = 31  # position 2 now reads the other request's KV
    batch = SimpleNamespace(
        forward_mode=Mode(False), seq_lens=torch.tensor([7]), input_ids=torch.tensor([honest[0]]),
        req_pool_indices=torch.tensor([0]), out_cache_loc=torch.tensor([16]),
    )  # fmt: skip
    mixed = worker.forward_batch_generation(batch)[0]
    assert mixed != driver.context_tokens.reference(7, [*tokens, honest[0]], 1, (257, 0.0))[0]


def test_ops_become_sglang_http_calls(driver) -> None:
    """Each op is the native API's call; rids carry the trace mark (an abort by prefix spares
    r10), a session turn's parent rid too."""
    op = {"op": "submit", "rid": "r1", "input_ids": [5, 6], "max_new_tokens": 3,
          "ignore_eos": True, "session": {"id": "s0", "rid": "r0"}}  # fmt: skip
    path, body, key = driver.client.op_request(op)
    assert (path, key) == ("/generate", ["TokenizedGenerateReqInput", "r1"])
    assert body["rid"] == "r1\x1f" and body["session_params"] == {"id": "s0", "rid": "r0\x1f"}
    assert body["sampling_params"] == {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}
    open_ = {"op": "open_session", "session_id": "s0", "streaming": True, "timeout": 5.0}
    assert driver.client.op_request(open_)[0:2] == (
        "/open_session",
        {"capacity_of_str_len": 100_000, "session_id": "s0", "streaming": True, "timeout": 5.0},
    )
    assert driver.client.op_request({"op": "abort", "rid": "r3"})[1] == {"rid": "r3\x1f"}
    with pytest.raises(ValueError, match="no HTTP call"):
        driver.client.op_request({"op": "step"})


def test_the_configuration_is_sglang_flags(driver) -> None:
    """The config op is SGLang's own flags; a CPU run adds the fake worker's, a GPU's none."""
    argv = driver.launch.command(dict(CFG, overlap=False, cache="chunk"), 30000)
    for flag in ("--page-size", "--max-total-tokens", "--skip-tokenizer-init", "--device"):
        assert flag in argv
    assert {
        "--disable-overlap-schedule",
        "--disable-radix-cache",
        "--enable-streaming-session",
    } <= set(argv)
    assert "--enable-mixed-chunk" not in argv
    gpu = driver.launch.command(CFG, 30000, "MODEL", cpu=False)
    assert "--device" not in gpu and "--load-format" not in gpu and gpu[3] == "MODEL"
    env = driver.launch.sglang_environment(dict(CFG, retract_interval=3))
    assert env["SGLANG_TEST_RETRACT"] == "1" and env["SGLANG_TEST_RETRACT_INTERVAL"] == "3"


class Answered:
    """A finished HTTP call, as client.Call leaves it."""

    def __init__(self, status: int, body: dict) -> None:
        import json

        self.status, self.text = status, json.dumps(body)

    def json(self) -> dict:
        import json

        return json.loads(self.text)


def meta(prompt: int, completion: int, cached: int, finish: str = "length") -> dict:
    reason = {"type": finish}
    info = dict(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    return {"meta_info": dict(info, finish_reason=reason)}


def test_http_answers_become_response_views(driver) -> None:
    """A streaming turn's parent is the last successful turn; its reference is checked over
    the whole context; a rejection is a 400 abort; an answer with no counts is no view."""
    said = driver.responses.Responses(7, (257, 0.0))
    said.opened("s0", True)
    turn1 = {
        "op": "submit",
        "rid": "t1",
        "input_ids": [5, 6, 7],
        "max_new_tokens": 2,
        "session": {"id": "s0"},
    }
    turn2 = dict(turn1, rid="t2", input_ids=[8])
    said.submitted(turn1)
    out1 = driver.context_tokens.reference(7, [5, 6, 7], 2, (257, 0.0))
    first = said.view("t1", Answered(200, {"output_ids": out1, **meta(3, 2, 0)}), 4, {})
    assert first["response"]["reference_checked"] and first["response"]["reference_ids"] == out1
    said.submitted(turn2)
    second = said.view("t2", Answered(200, {"output_ids": [9, 9], **meta(6, 2, 4)}), 9, {})[
        "response"
    ]
    assert (second["turn"], second["parent_turn"], second["parent_prompt_tokens"]) == (2, 1, 3)
    assert second["reference_ids"] == driver.context_tokens.reference(
        7, [5, 6, 7, *out1, 8], 2, (257, 0.0)
    )
    said.submitted(dict(turn1, rid="t3"))
    rejected = said.view("t3", Answered(400, {"error": {"message": "busy"}}), 9, {})["response"]
    assert (
        rejected["rejected"]
        and rejected["status_code"] == 400
        and rejected["finish_type"] == "abort"
    )
    said.submitted({"op": "submit", "rid": "r9", "input_ids": [1], "max_new_tokens": 2})
    queued_abort = {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort"}}}
    assert said.view("r9", Answered(200, queued_abort), 9, {}) is None


def test_reproducer_rounds_wait_for_what_had_finished(driver) -> None:
    """Calls are grouped by the iteration they were sent after; a round first awaits the
    requests the gated run had finished by then; a hang-up and a clock advance are said."""
    sent = [
        (0, {"op": "open_session", "session_id": "s0", "streaming": False}),
        (
            0,
            {
                "op": "submit",
                "rid": "r0",
                "input_ids": [5],
                "max_new_tokens": 2,
                "ignore_eos": True,
            },
        ),
        (
            4,
            {
                "op": "submit",
                "rid": "r1",
                "input_ids": [6],
                "max_new_tokens": 2,
                "ignore_eos": True,
            },
        ),
        (4, {"op": "abort", "rid": "r1", "disconnect": True}),
        (6, {"op": "advance_clock", "seconds": 2.0}),
    ]
    rounds = driver.reproducer.rounds(sent, {"r0": 3, "r1": 5})
    assert [r["after"] for r in rounds] == [[], ["r0"], ["r1"]]
    assert [c[0] for c in rounds[0]["calls"]] == ["/open_session", "/generate"]
    assert rounds[1]["calls"][1] == ["hang_up", {"rid": "r1"}]
    assert rounds[2]["calls"] == [["sleep", {"seconds": 2.0}]]
    text = driver.reproducer.script(dict(sent=sent, finished_at={"r0": 3}, title="t", expected="e"))
    compile(text, "repro.py", "exec")  # the filled template is Python


def test_the_server_target_refuses_what_it_does_not_drive() -> None:
    """Speculative decoding, hybrid SWA/MLA pools and the on-demand retract are refused
    before a server starts, each with its reason."""
    plain = Trace(name="t", engine=EngineSpec(), ops=[Step()])
    assert adapter.unsupported(plain) == []
    swa = Trace(name="t", engine=EngineSpec(swa_tokens=256, sliding_window=32), ops=[])
    assert any("swa_tokens" in why for why in adapter.unsupported(swa))


def test_a_disconnect_is_an_abort_to_every_scheduler() -> None:
    """The disconnect op reaches drivers as an abort marked ``disconnect`` (the server's
    driver hangs the client up instead); the explorer draws it only on the server target."""
    assert op_message(Disconnect(rid="r1")) == {"op": "abort", "rid": "r1", "disconnect": True}
    drawn = [adapter.swarm(seed).weights for seed in range(20)]
    assert any(w["disconnect"] > 0 for w in drawn)
    assert all((w["disconnect"] > 0) == (w["abort"] > 0) for w in drawn)


def test_kvspec_runs_a_disconnect_as_an_abort() -> None:
    """On kvspec's own engine the request a client hung up on is aborted."""
    from invariants.checking.loader import shipped_catalog
    from invariants.scenarios.trace_run import run_trace

    ops = [
        Submit(rid="r0", input_ids=list(range(5, 20)), max_new_tokens=30),
        Step(n=3),
        Disconnect(rid="r0"),
    ]
    result = run_trace(Trace(name="t", ops=ops), shipped_catalog())
    assert result.ok
    assert result.results[-1].status == "ok"
    assert result.responses["r0"].finish_type == "abort"


def test_a_slow_target_shrinks_on_its_twin_and_confirms_at_home(monkeypatch) -> None:
    """The explorer shrinks a server finding on the sglang-scheduler twin when the key holds
    there, runs the shrunk trace once more on the server, and keeps it only if the key holds
    there too; else it shrinks on the server within the server's own budget."""
    from invariants.targets import explore

    key, ran = "engine.exception@x.py:f", {"sglang-server": 0, "sglang-scheduler": 0}
    twin_sees_it = {"now": True}

    def run(self, trace, keep_views=False):
        ran[self.name] += 1
        return self.name, trace

    def fails(ran_on):
        name, trace = ran_on
        bad = any(getattr(op, "rid", None) == "r3" for op in trace.ops)
        return key if bad and (name == "sglang-server" or twin_sees_it["now"]) else None

    monkeypatch.setattr(explore.RealTarget, "run", run)
    monkeypatch.setattr(explore, "failure_key", fails)
    ops = [Submit(rid=f"r{i}", input_ids=[5], max_new_tokens=1) for i in range(6)]
    trace, server = Trace(name="t", ops=ops), explore.RealTarget("sglang-server")
    small, runs = explore._shrunk(server, trace, key, budget=120)
    assert [op.rid for op in small.ops] == ["r3"] and ran["sglang-server"] == 1
    twin_sees_it["now"] = False  # the twin does not show it: shrink at home, 12 runs at most
    ran.update({"sglang-server": 0, "sglang-scheduler": 0})
    small, runs = explore._shrunk(server, trace, key, budget=120)
    assert ran["sglang-scheduler"] == 1 and ran["sglang-server"] == runs <= 12
    assert "r3" in [op.rid for op in small.ops]
