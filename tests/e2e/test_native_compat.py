"""What SGLang's own clients send and read over the native API: ``max_new_tokens: 0`` (the
frontend's prefix caching and ``select``) answers an empty completion and leaves the server
healthy; stop strings finish a request and are trimmed from the text (kept with
``no_stop_trim``); ``/get_model_info``, ``/server_info`` and ``/health_generate`` answer;
every error, whatever its status, has one shape ``{"error": {"message", "type", "param",
"code"}}``."""

from __future__ import annotations

from dataclasses import replace

import httpx
from server_harness import BASE_ARGS, assert_clean_idle, encode, generate, live_server, meta

from engine.engine import Engine
from engine.request import SamplingParams
from invariants.scenarios.spec import EngineSpec


def test_max_new_tokens_zero_answers_an_empty_completion(client: httpx.Client) -> None:
    """Under overlap at level 2 (the defaults): 200, no text, no tokens, finished by length —
    alone and beside a request that decodes — and the accounting stays exact."""
    alone = generate(client, encode("prefix to cache"), 0)
    assert alone.status_code == 200, alone.text
    assert alone.json()["text"] == "" and alone.json()["output_ids"] == []
    assert meta(alone)["finish_reason"] == {"type": "length", "length": 0}
    assert meta(alone)["completion_tokens"] == 0
    again = meta(generate(client, encode("prefix to cache and more"), 4))
    assert again["cached_tokens"] > 0  # the empty completion left its prefix in the cache
    assert_clean_idle(client)


def test_a_stop_string_finishes_and_is_trimmed(client: httpx.Client) -> None:
    """The greedy output's bytes 3..5 as a stop string: the request stops right after them
    (``matched`` names the string), the text ends before it, the ids keep it; with
    ``no_stop_trim`` the text keeps it too."""
    prompt = encode("stop strings")
    full = generate(client, prompt, 12).json()["output_ids"]
    stop = bytes(full[3:5]).decode("latin-1")
    if any(t >= 128 for t in full[3:5]) or stop in bytes(full[:4]).decode("latin-1"):
        stop = bytes(full[2:3]).decode("latin-1")  # keep the check about the first match
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "stop": [stop]}}
    trimmed = client.post("/generate", json=body).json()
    end = bytes(full).decode("latin-1").index(stop) + len(stop)
    assert trimmed["output_ids"] == full[:end]
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert trimmed["text"] == bytes(full[: end - len(stop)]).decode("utf-8", errors="replace")
    body["sampling_params"]["no_stop_trim"] = True
    kept = client.post("/generate", json=body).json()
    assert kept["text"].endswith(stop) and kept["output_ids"] == full[:end]
    assert_clean_idle(client)


def test_a_batch_of_prompts_answers_a_list(client: httpx.Client) -> None:
    """``text`` (or ``input_ids``) as a list: one answer per prompt, in order, each equal to
    the prompt sent alone (SGLang's frontend sends ``select``'s choices so)."""
    alone = [generate(client, text=t, max_new_tokens=5).json()["output_ids"] for t in "ab"]
    batch = client.post(
        "/generate", json={"text": ["a", "b"], "sampling_params": {"max_new_tokens": 5}}
    )
    assert [b["output_ids"] for b in batch.json()] == alone
    ids = client.post(
        "/generate",
        json={"input_ids": [encode("a"), encode("b")], "sampling_params": {"max_new_tokens": 5}},
    )
    assert [b["output_ids"] for b in ids.json()] == alone
    assert_clean_idle(client)


def test_prompt_logprobs_come_with_their_text(client: httpx.Client) -> None:
    """``logprob_start_len`` 2 of a 6-token prompt: four ``[logprob, id, text]`` entries;
    from 0 the first token (no context) has no logprob."""
    body = {"text": "hello", "return_logprob": True, "return_text_in_logprobs": True}
    body |= {"logprob_start_len": 2, "sampling_params": {"max_new_tokens": 0}}
    entries = client.post("/generate", json=body).json()["meta_info"]["input_token_logprobs"]
    assert [(e[1], e[2]) for e in entries] == [(101, "e"), (108, "l"), (108, "l"), (111, "o")]
    assert all(isinstance(e[0], float) for e in entries)
    body["logprob_start_len"] = 0
    first = client.post("/generate", json=body).json()["meta_info"]["input_token_logprobs"]
    assert first[0][0] is None and len(first) == 6
    assert_clean_idle(client)


def test_n_samples_share_the_cached_prompt(client: httpx.Client) -> None:
    """``n: 3`` (SGLang's parallel sampling): the prompt is prefilled once (a
    ``max_new_tokens: 0`` request), then three samples that each find it cached."""
    body = {"text": "shared prompt for three", "sampling_params": {"max_new_tokens": 4, "n": 3}}
    answers = client.post("/generate", json=body).json()
    assert len(answers) == 3 and len({tuple(a["output_ids"]) for a in answers}) == 1  # greedy
    prompt = answers[0]["meta_info"]["prompt_tokens"]
    assert all(a["meta_info"]["cached_tokens"] == prompt - 1 for a in answers)
    assert_clean_idle(client)


def test_the_frontend_routes_answer(client: httpx.Client) -> None:
    """``RuntimeEndpoint`` reads ``/get_model_info`` first; ``/server_info`` is the newer name
    of ``/get_server_info``; ``/health_generate`` runs one token through the engine."""
    info = client.get("/get_model_info").json()
    assert info["model_path"] == "kvspec-sim" and info["is_generation"] is True
    assert client.get("/server_info").json()["server_args"]["page_size"] == 1
    assert client.get("/health_generate").status_code == 200
    assert_clean_idle(client)


def _shape(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error["message"]


def test_every_error_has_one_shape() -> None:
    """404 (unknown route), 405 (wrong method), 401 (no API key), 400 (schema and engine):
    the same JSON shape, a message and an error type."""
    with live_server(replace(BASE_ARGS, api_key="k")) as (_, client):
        assert "Unauthorized" in _shape(client.post("/generate", json={"text": "a"}), 401)
        client.headers["Authorization"] = "Bearer k"
        assert _shape(client.get("/nope"), 404) == "Not Found"
        assert _shape(client.get("/generate"), 405) == "Method Not Allowed"
        assert "Either text" in _shape(client.post("/generate", json={}), 400)
        message = _shape(client.post("/generate", json={"text": "a", "rid": ""}), 400)
        assert "rid" in message
        assert client.get("/health").status_code == 200


def test_min_new_tokens_and_penalties_change_the_tokens(client: httpx.Client) -> None:
    """The third greedy token as a stop token id ends the request after 3 tokens; with
    ``min_new_tokens: 5`` it cannot come before 5 tokens (SGLang's penalizer masks it). A
    frequency penalty of 2 gives other tokens than none. Both answer as an Engine with the
    same parameters does; the accounting stays exact."""
    prompt = encode("penalizers over http")
    full = generate(client, prompt, 24).json()["output_ids"]
    stop = full[2]
    cut = generate(
        client, prompt, 24, sampling_params={"max_new_tokens": 24, "stop_token_ids": [stop]}
    )
    assert cut.json()["output_ids"] == full[: full.index(stop) + 1]
    held = generate(
        client,
        prompt,
        sampling_params={"max_new_tokens": 24, "stop_token_ids": [stop], "min_new_tokens": 5},
    ).json()["output_ids"]
    assert stop not in held[:5] and held != full[: len(held)]
    engine = Engine(EngineSpec(chunked_prefill_size=64).engine_config(0))
    params = SamplingParams(max_new_tokens=24, stop_token_ids=(stop,), min_new_tokens=5)
    assert list(engine.generate([prompt], params)[0].output_ids) == held
    repeated = generate(
        client, prompt, sampling_params={"max_new_tokens": 24, "frequency_penalty": 2.0}
    ).json()["output_ids"]
    assert len(repeated) == 24 and repeated != full
    assert_clean_idle(client)
