"""The server's request and response bodies (SGLang's ``managers/io_struct.py`` shapes, one
request per call): pydantic models, so FastAPI validates them and publishes the OpenAPI schema.

Keeps: a body that validates can be handed to the engine — unknown keys are refused
(``extra="forbid"``), numbers are range-checked here, and ``text`` / ``input_ids`` are checked
to name exactly one prompt. Everything else (sessions, lengths) is the engine's to judge.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.model.tokenizer import VOCAB_SIZE
from engine.request import SamplingParams

TokenId = Field(ge=0, lt=VOCAB_SIZE)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingParamsIn(_Body):
    """SGLang's ``sampling_params``. The models are greedy: a positive temperature (and the
    top-p/k/min-p filters) are accepted and passed through, as the engine documents."""

    max_new_tokens: int = Field(128, ge=0, le=1 << 20)
    temperature: float = Field(0.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False  # the engine never trims (stop strings are not supported)
    spaces_between_special_tokens: bool = True
    n: Literal[1] = 1

    def engine_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            temperature=self.temperature,
        )


class SessionParamsIn(_Body):
    """SGLang's ``session_params``: which session, which request to append to, and how."""

    id: str | None = None
    rid: str | None = None
    offset: int | None = None
    replace: bool | None = None
    drop_previous_output: bool | None = None


class GenerateRequest(_Body):
    """``/generate``: exactly one of ``text`` (byte-tokenized, BOS first) and ``input_ids``."""

    text: str | None = None
    input_ids: list[int] | None = Field(None, min_length=1, max_length=1 << 20)
    sampling_params: SamplingParamsIn = SamplingParamsIn()
    rid: str | None = Field(None, min_length=1, max_length=256)
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = Field(-1, ge=-1)
    session_params: SessionParamsIn | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("Either text or input_ids should be provided (exactly one).")
        bad = [t for t in self.input_ids or () if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise ValueError(f"input_ids {bad[:5]} are outside the vocabulary [0, {VOCAB_SIZE})")
        return self


class OpenSessionRequest(_Body):
    """``/open_session``: ``capacity_of_str_len`` is stored and never enforced (as SGLang)."""

    capacity_of_str_len: int = Field(ge=0)
    session_id: str | None = Field(None, min_length=1, max_length=256)
    streaming: bool | None = None
    timeout: float | None = Field(None, gt=0.0)


class CloseSessionRequest(_Body):
    session_id: str = Field(min_length=1, max_length=256)


class AbortRequest(_Body):
    """``/abort_request``: one request by id, or every request with ``abort_all``."""

    rid: str = ""
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


class ErrorResponse(BaseModel):
    """SGLang's error body: ``{"error": {"message": ...}}``."""

    error: ErrorBody
