"""The server's request and response bodies (SGLang's ``managers/io_struct.py`` shapes, one
request per call): pydantic models, so FastAPI validates them and publishes the OpenAPI schema.

Keeps: a body that validates can be handed to the engine — unknown keys are refused
(``extra="forbid"``), numbers are range-checked here, and ``text`` / ``input_ids`` are checked
to name exactly one prompt. Everything else (sessions, lengths) is the engine's to judge.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from engine.model.tokenizer import VOCAB_SIZE
from engine.request import SamplingParams

TokenId = Field(ge=0, lt=VOCAB_SIZE)


def _utf8(text: str) -> str:
    """JSON may carry a lone surrogate (``"\\ud800"``) that no UTF-8 text holds."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"not valid UTF-8 text: a lone surrogate {text[exc.start]!r} at character {exc.start}"
        ) from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]
# what the engine cannot do yet, and the value that means "not asked for" (SGLang's frontend
# sends every one of them with that value)
UNSUPPORTED: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
}


def refuse_unsupported(body: BaseModel, names: Iterable[str]) -> None:
    """A 400 (a schema error) naming the first of ``names`` not at its neutral value."""
    for name in names:
        if getattr(body, name) != UNSUPPORTED[name]:
            raise ValueError(
                f"{name}={getattr(body, name)!r} is not supported by kvspec's engine "
                f"(only {UNSUPPORTED[name]!r}): constrained decoding changes no KV"
            )


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """SGLang's and OpenAI's ``stop`` (one string or a list) as the engine's tuple."""
    stops = [stop] if isinstance(stop, str) else stop or []
    return tuple(s for s in stops if s)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingParamsIn(_Body):
    """SGLang's ``sampling_params``. The models are greedy: a positive temperature (and the
    top-p/k/min-p filters, a sampling seed) are accepted and passed through, as the engine
    documents. ``min_new_tokens`` and the frequency and presence penalties change the greedy
    token as SGLang's penalizers do. Stop strings match the output's bytes; the text is
    trimmed of the matched one unless ``no_stop_trim``. The fields of ``UNSUPPORTED`` are
    accepted at their neutral value and answered 400 otherwise, naming the field."""

    max_new_tokens: int = Field(128, ge=0, le=1 << 20)
    temperature: float = Field(0.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    sampling_seed: int | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    spaces_between_special_tokens: bool = True
    n: int = Field(1, ge=1, le=64)  # parallel samples: the prompt is cached once, then n run
    min_new_tokens: int = Field(0, ge=0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    regex: Text | None = None
    json_schema: Text | None = None
    ebnf: Text | None = None
    structural_tag: Text | None = None
    stop_regex: Text | list[Text] | None = None

    @model_validator(mode="after")
    def _supported(self) -> SamplingParamsIn:
        if self.stop_regex == []:
            self.stop_regex = None  # the frontend's "no stop regex"
        refuse_unsupported(self, UNSUPPORTED)
        if self.min_new_tokens > self.max_new_tokens:  # SGLang's SamplingParams.verify
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                f"got {self.min_new_tokens}"
            )
        return self

    def engine_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            temperature=self.temperature,
            stop_strs=stop_strings(self.stop),
            min_new_tokens=self.min_new_tokens,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
        )


class SessionParamsIn(_Body):
    """SGLang's ``session_params``: which session, which request to append to, and how."""

    id: Text | None = None
    rid: Text | None = None
    offset: int | None = None
    replace: bool | None = None
    drop_previous_output: bool | None = None


class GenerateRequest(_Body):
    """``/generate``: exactly one of ``text`` (byte-tokenized, BOS first) and ``input_ids``;
    either may be a list of prompts (a batch, answered as a list; not streamed)."""

    text: Text | list[Text] | None = None
    input_ids: list[int] | list[list[int]] | None = Field(None, min_length=1, max_length=1 << 20)
    sampling_params: SamplingParamsIn = SamplingParamsIn()
    rid: Text | None = Field(None, min_length=1, max_length=256)
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = Field(-1, ge=-1)
    return_text_in_logprobs: bool = False
    top_logprobs_num: Literal[0] = 0
    session_params: SessionParamsIn | None = None
    session_id: Text | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("Either text or input_ids should be provided (exactly one).")
        if self.session_id is not None and self.session_params is not None:
            raise ValueError("session_id and session_params are mutually exclusive")
        for ids in self.prompts() if self.input_ids is not None else ():
            bad = [t for t in ids if not 0 <= t < VOCAB_SIZE]
            if bad:
                raise ValueError(
                    f"input_ids {bad[:5]} are outside the vocabulary [0, {VOCAB_SIZE})"
                )
            if not ids:
                raise ValueError("input_ids: an empty prompt")
        if self.is_batch and not self.prompts():
            raise ValueError("text: an empty list of prompts")
        if self.is_list and (self.stream or self.session_params or self.session_id):
            raise ValueError(
                "a batch of prompts (or n > 1 samples) is neither streamed nor a session turn"
            )
        return self

    @property
    def is_list(self) -> bool:
        """Answered as a list: a batch of prompts, or n > 1 samples (SGLang's shapes)."""
        return self.is_batch or self.sampling_params.n > 1

    @property
    def is_batch(self) -> bool:
        prompt = self.text if self.text is not None else self.input_ids
        return isinstance(prompt, list) and (self.text is not None or isinstance(prompt[0], list))

    def prompts(self) -> list[Any]:
        """Each prompt: a text or a list of ids."""
        prompt = self.text if self.text is not None else self.input_ids
        return list(prompt) if self.is_batch else [prompt]  # type: ignore[arg-type]


class OpenSessionRequest(_Body):
    """``/open_session``: ``capacity_of_str_len`` is stored and never enforced (as SGLang)."""

    capacity_of_str_len: int = Field(ge=0)
    session_id: Text | None = Field(None, min_length=1, max_length=256)
    streaming: bool | None = None
    timeout: float | None = Field(None, gt=0.0)


class CloseSessionRequest(_Body):
    session_id: Text = Field(min_length=1, max_length=256)


class AbortRequest(_Body):
    """``/abort_request``: one request by id, or every request with ``abort_all``."""

    rid: Text = ""
    abort_all: bool = False


class MetaInfo(BaseModel):
    """``meta_info`` of a response (``output_token_logprobs``: ``[logprob, token id, None]``
    per output token when ``return_logprob``)."""

    id: str
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float
    output_token_logprobs: list[list[Any]] | None = None


class GenerateResponse(BaseModel):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """Every error: SGLang's ``{"error": {"message": ...}}`` with OpenAI's fields."""

    error: ErrorBody
