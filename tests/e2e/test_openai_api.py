"""OpenAI's own Python client against ``kvspec serve``'s ``/v1`` routes: the model list,
completions and chat completions, streamed and not, with ``usage`` (cached tokens
included), stop strings, SGLang's top-level ``session_id`` and OpenAI's error shape — each
request checked by the whole catalog at level 2, the accounting exact at idle."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_harness import LiveServer, assert_clean_idle, close_session, open_session

SYSTEM = "You are a checker of KV caches. " * 3


@pytest.fixture
def oai(server_client: tuple[LiveServer, httpx.Client]) -> openai.OpenAI:
    server, _ = server_client
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def test_the_model_list_names_the_served_model(oai: openai.OpenAI) -> None:
    """``/v1/models`` (what ``sglang.utils.wait_for_server`` polls) lists one model."""
    assert [m.id for m in oai.models.list()] == ["kvspec-sim"]


def test_a_completion_matches_the_native_api(oai: openai.OpenAI, client: httpx.Client) -> None:
    """The same prompt and budget give the same text as ``/generate``; ``usage`` counts the
    BOS-prefixed prompt and the completion; a repeat is served from the prefix cache."""
    native = client.post(
        "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 8}}
    )
    first = oai.completions.create(model="kvspec-sim", prompt="hello", max_tokens=8, temperature=0)
    assert first.choices[0].text == native.json()["text"]
    assert first.choices[0].finish_reason == "length"
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (6, 8)
    assert first.usage.prompt_tokens_details.cached_tokens > 0  # /generate cached it
    texts = oai.completions.create(model="kvspec-sim", prompt=["hi", "ho"], max_tokens=3)
    ids = oai.completions.create(model="kvspec-sim", prompt=[[256, 104, 105]], max_tokens=3)
    assert [c.index for c in texts.choices] == [0, 1]
    assert texts.choices[0].text == ids.choices[0].text  # "hi" is BOS + 104, 105
    assert texts.usage.prompt_tokens == 6
    assert_clean_idle(client)


def test_chat_streamed_equals_chat_whole(oai: openai.OpenAI, client: httpx.Client) -> None:
    """A streamed chat completion's deltas join to the non-streamed answer; the first chunk
    names the role, the last the finish reason, then the usage chunk."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "count"}]
    whole = oai.chat.completions.create(model="kvspec-sim", messages=messages, max_tokens=12)
    chunks = list(
        oai.chat.completions.create(
            model="kvspec-sim",
            messages=messages,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the system prompt
    assert_clean_idle(client)


def test_stop_strings_and_streamed_completions(oai: openai.OpenAI, client: httpx.Client) -> None:
    """A stop string taken from the greedy output finishes the completion before it, streamed
    or not, with ``finish_reason`` ``stop``."""
    full = oai.completions.create(model="kvspec-sim", prompt="abc", max_tokens=10).choices[0].text
    stop = next(ch for ch in full[1:] if ch.isascii() and ch.isprintable() and full.index(ch) >= 1)
    cut = full[: full.index(stop)]
    whole = oai.completions.create(model="kvspec-sim", prompt="abc", max_tokens=10, stop=[stop])
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (cut, "stop")
    stream = oai.completions.create(
        model="kvspec-sim", prompt="abc", max_tokens=10, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == cut
    assert_clean_idle(client)


def test_session_id_appends_to_an_open_session(oai: openai.OpenAI, client: httpx.Client) -> None:
    """SGLang's top-level ``session_id``: the second turn is appended to the first and served
    from the session's KV (every prompt token of turn one cached)."""
    sid = open_session(client)
    first = oai.completions.create(
        model="kvspec-sim", prompt="turn one", max_tokens=4, extra_body={"session_id": sid}
    )
    second = oai.completions.create(
        model="kvspec-sim", prompt=" and two", max_tokens=4, extra_body={"session_id": sid}
    )
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    close_session(client, sid)
    assert_clean_idle(client)


def test_errors_come_in_openai_shape(oai: openai.OpenAI, client: httpx.Client) -> None:
    """A bad body is a ``BadRequestError`` whose message names the field; an unknown session
    too; the server goes on."""
    with pytest.raises(openai.BadRequestError) as bad:
        oai.completions.create(model="kvspec-sim", prompt="x", max_tokens=-1)
    assert "max_tokens" in bad.value.message
    with pytest.raises(openai.BadRequestError) as unknown:
        oai.chat.completions.create(
            model="kvspec-sim",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"session_id": "nope"},
        )
    assert "session id nope does not exist" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as minimum:
        oai.completions.create(
            model="kvspec-sim", prompt="x", max_tokens=2, extra_body={"min_tokens": 3}
        )
    assert "min_tokens=3 is more than the 2 tokens asked for" in minimum.value.message
    assert_clean_idle(client)


def test_n_choices_share_the_cached_prompt(oai: openai.OpenAI, client: httpx.Client) -> None:
    """``n=3``: three choices, indexed 0..2, each sampled after the prompt was cached once
    (greedy: the same text); usage counts the three completions."""
    answer = oai.completions.create(model="kvspec-sim", prompt="three ways", max_tokens=4, n=3)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert len({c.text for c in answer.choices}) == 1
    assert answer.usage.completion_tokens == 12
    assert answer.usage.prompt_tokens_details.cached_tokens == 3 * (
        answer.usage.prompt_tokens // 3 - 1
    )
    assert_clean_idle(client)
