"""The ``/v1`` request bodies (OpenAI's completions and chat completions, as SGLang serves
them), and the byte-level chat template.

Keeps: a body that validates can be handed to the engine. Unknown keys are refused naming
them; OpenAI's knobs that change nothing in a greedy engine's KV are accepted at their
neutral value only (penalties, ``logprobs``); ``n`` > 1 choices are sampled as SGLang does
(the prompt cached once), like the native API; SGLang's top-level
``session_id`` (#29436) names an open session the prompt is appended to.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from engine.model.tokenizer import VOCAB_SIZE
from engine.request import SamplingParams
from engine.server.schemas import Text, _Body, stop_strings

ROLES = ("system", "user", "assistant", "tool", "developer")


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The byte-level chat template: each message as ``<|role|>\\n`` + content + ``\\n``, then
    ``<|assistant|>\\n`` for the reply (the tokenizer adds BOS)."""
    turns = "".join(f"<|{m.role}|>\n{m.text()}\n" for m in messages)
    return turns + "<|assistant|>\n"


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Body):
    """What completions and chat completions share."""

    model: Text
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    user: Text | None = None
    n: int = Field(1, ge=1, le=64)  # choices per prompt (SGLang's parallel sampling)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    min_tokens: int = Field(0, ge=0)  # SGLang's extra parameter (its min_new_tokens)
    ignore_eos: bool = False
    rid: Text | None = Field(None, min_length=1, max_length=256)
    session_id: Text | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _supported(self) -> _Sampling:
        if self.n > 1 and self.stream:
            raise ValueError("n > 1 choices are not streamed")
        if self.min_tokens > self.budget():
            raise ValueError(
                f"min_tokens={self.min_tokens} is more than the {self.budget()} tokens asked for"
            )
        return self

    def budget(self) -> int:
        """The most tokens a choice may have (each route names it its own way)."""
        raise NotImplementedError

    def engine_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_tokens,
            ignore_eos=self.ignore_eos,
            temperature=self.temperature,
            stop_strs=stop_strings(self.stop),
            min_new_tokens=min(self.min_tokens, max_tokens),
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    """``/v1/completions``: one prompt (text or token ids) or a list of them (not streamed)."""

    prompt: Text | list[Text] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=0, le=1 << 20)
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None

    def budget(self) -> int:
        return self.max_tokens

    @model_validator(mode="after")
    def _prompts(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt: an empty list names no prompt")
        for prompt in self.prompts():
            bad = [t for t in prompt if not 0 <= t < VOCAB_SIZE] if isinstance(prompt, list) else []
            if bad or prompt in ("", []):
                what = f"token ids {bad[:5]} outside [0, {VOCAB_SIZE})" if bad else "is empty"
                raise ValueError(f"prompt: {what}")
        if self.stream and len(self.prompts()) > 1:
            raise ValueError("prompt: a list of prompts cannot be streamed")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    """``/v1/chat/completions``: the messages through the byte-level chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0, le=1 << 20)
    max_completion_tokens: int | None = Field(None, ge=0, le=1 << 20)
    logprobs: Literal[False] = False

    def budget(self) -> int:
        """``max_completion_tokens`` (OpenAI's current name), else ``max_tokens``, else 128."""
        for value in (self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return 128
