"""Pydantic request models for `/v1/chat/completions` and `/v1/completions`, plus builders
for the response objects and stream chunks the official `openai` SDK parses.

Parsing goes through `parse_chat_request` / `parse_completion_request`, which turn any
validation failure into a 400 `HttpError` naming the offending parameter (never a 500).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.openai_fields import check_fields
from loraplex.platform.gateway.openai_structured import (
    MAX_TOOLS,
    ConstraintFields,
    Tool,
    ToolCallIn,
    ToolChoice,
)
from loraplex.platform.tokenizing.token_bytes import display_bytes

MAX_N = 8
MAX_STOP = 4
MAX_STOP_LEN = 256
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_LOGIT_BIAS = 300


class StreamOptions(BaseModel):
    """`stream_options`: only `include_usage` is meaningful."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class TextPart(BaseModel):
    """One text part of a message's content list."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A chat message; content is a string or a list of text parts (images are refused)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCallIn] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(default=None, max_length=256)

    @model_validator(mode="after")
    def _check_tool_fields(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (tool calls and tool results included)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.template_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def text(self) -> str:
        """The message content flattened to one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(ConstraintFields):
    """Parameters shared by chat and text completions, with OpenAI's ranges. Fields the model
    does not have are kept as extras and refused by name after it runs
    (`openai_fields.check_fields`), so none is silently dropped."""

    model_config = ConfigDict(extra="allow")

    # A per-adapter route passes its adapter (validation context "adapter") for a body
    # that names no model.
    model: str = Field(default=None, min_length=1, max_length=256, validate_default=True)
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    # vLLM's extensions to the OpenAI body, as its server takes them.
    ignore_eos: StrictBool | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model_or_adapter(cls, value: Any, info: ValidationInfo) -> Any:
        adapter = (info.context or {}).get("adapter")
        if not value and adapter:
            return adapter
        if value is None:
            raise PydanticCustomError("missing", "Field required")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"values must be in [-100, 100], got {bias}")
        return value

    def token_logit_bias(self) -> dict[int, float] | None:
        """`logit_bias` keyed by token id (None when not given)."""
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else list(value)
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        for s in stops:
            if not s or len(s) > MAX_STOP_LEN:
                raise ValueError(f"each stop sequence must have 1 to {MAX_STOP_LEN} characters")
        return stops

    @model_validator(mode="after")
    def _check_stream_options(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        """Whether the stream should end with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def stops(self) -> list[str]:
        """The stop sequences as a list (validated above)."""
        return list(self.stop or [])


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions` body."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    """`POST /v1/completions` body: one prompt (text or token ids)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_prompt(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.echo:
            raise ValueError("echo is not supported")
        p = self.prompt
        if isinstance(p, list):
            if len(p) == 0:
                raise ValueError("prompt must not be empty")
            if isinstance(p[0], (str, list)) and len(p) != 1:
                raise ValueError("only one prompt per request is supported")
        return self

    def requested_max_tokens(self) -> int:
        """Completions default to 16 tokens, as OpenAI's legacy endpoint does."""
        return self.max_tokens if self.max_tokens is not None else 16

    def prompt_text_or_ids(self) -> str | list[int]:
        """The single prompt as text or as token ids."""
        p = self.prompt
        if isinstance(p, str):
            return p
        first = p[0]
        if isinstance(first, str):
            return first
        if isinstance(first, list):
            return list(first)
        return list(p)  # type: ignore[arg-type]  # p[0] is an int: p is one prompt's token ids


def _param_of(loc: tuple[Any, ...]) -> str | None:
    """`("messages", 0, "role")` -> `messages[0].role`; union-member tags are dropped."""
    if not loc:
        return None
    param = str(loc[0])
    if param == "messages" and len(loc) > 1 and isinstance(loc[1], int):
        param += f"[{loc[1]}]"
        if len(loc) > 2 and loc[2] in ChatMessage.model_fields:
            param += f".{loc[2]}"
    return param


def _first_error(exc: ValidationError) -> HttpError:
    err = exc.errors()[0]
    param = _param_of(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    where = f"`{param}`: " if param else ""
    code = "missing_required_parameter" if err.get("type") == "missing" else "invalid_value"
    return HttpError(400, f"Invalid request: {where}{msg}", param=param, code=code)


_Body = TypeVar("_Body", bound=BaseModel)
BodyInput = bytes | str | dict[str, Any]
"""A body as the route read it (bytes, parsed straight into the model) or as a mapping."""


def _json_error(exc: ValidationError) -> HttpError | None:
    """The 400 for a body that is not JSON, or not a JSON object (None: it is one)."""
    err = exc.errors()[0]
    if err.get("type") == "json_invalid":
        reason = str(err.get("ctx", {}).get("error", "invalid JSON"))
        if "recursion limit" in reason:
            reason = "it is nested too deeply"
        return HttpError(400, f"The request body is not valid JSON: {reason}", code="invalid_json")
    if not err.get("loc") and err.get("type") in ("model_type", "model_attributes_type"):
        return HttpError(400, "The request body must be a JSON object.", code="invalid_json")
    return None


def _parse(model: type[_Body], body: BodyInput, adapter: str | None = None) -> _Body:
    """`body` as `model`, parsed straight from its bytes (no JSON dict in between); a 400
    naming the field for what is not JSON, not served or out of range. `adapter`: the model
    a per-adapter route names, used when the body names none."""
    context = {"adapter": adapter}
    try:
        if isinstance(body, (bytes, str)):
            parsed = model.model_validate_json(body, context=context)
        else:
            parsed = model.model_validate(body, context=context)
    except ValidationError as exc:
        raise _json_error(exc) or _first_error(exc) from None
    check_fields(parsed.model_extra or {}, set())
    return parsed


def parse_chat_request(body: BodyInput, adapter: str | None = None) -> ChatCompletionRequest:
    """Validate a chat completion body; a 400 `HttpError` on bad input."""
    return _parse(ChatCompletionRequest, body, adapter)


def parse_completion_request(body: BodyInput, adapter: str | None = None) -> CompletionRequest:
    """Validate a text completion body; a 400 `HttpError` on bad input."""
    return _parse(CompletionRequest, body, adapter)


# ---------------------------------------------------------------- response builders


def new_id(prefix: str) -> str:
    """An OpenAI-style object id (`chatcmpl-...`, `cmpl-...`)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage_dict(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """The `usage` object, with `prompt_tokens_details.cached_tokens`."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def chat_logprobs_entry(token: str, logprob: float, top: list[tuple[str, float]]) -> dict[str, Any]:
    """One `logprobs.content[]` entry of a chat choice."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(display_bytes(token)),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(display_bytes(t))} for t, lp in top
        ],
    }


def _message(choice: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a choice (`tool_calls` only when it made calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
    if choice.get("tool_calls"):
        message["tool_calls"] = choice["tool_calls"]
    return message


def chat_completion(
    cid: str, created: int, model: str, choices: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    """A full `chat.completion` object; `choices` hold index, text, logprobs, finish_reason."""
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": c["index"],
                "message": _message(c),
                "logprobs": {"content": c["logprobs"]} if c.get("logprobs") is not None else None,
                "finish_reason": c["finish_reason"],
            }
            for c in choices
        ],
        "usage": usage,
    }


def chat_chunk(
    cid: str,
    created: int,
    model: str,
    index: int,
    delta: dict[str, Any],
    *,
    logprobs: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    with_usage_field: bool = False,
) -> dict[str, Any]:
    """One `chat.completion.chunk` carrying a delta for one choice."""
    chunk: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": index,
                "delta": delta,
                "logprobs": {"content": logprobs} if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
    }
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def text_completion(
    cid: str, created: int, model: str, choices: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    """A full `text_completion` object."""
    return {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": c["index"],
                "text": c["text"],
                "logprobs": c.get("logprobs"),
                "finish_reason": c["finish_reason"],
            }
            for c in choices
        ],
        "usage": usage,
    }


def text_chunk(
    cid: str,
    created: int,
    model: str,
    index: int,
    text: str,
    *,
    logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    with_usage_field: bool = False,
) -> dict[str, Any]:
    """One streamed `text_completion` chunk."""
    chunk: dict[str, Any] = {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def usage_chunk(
    cid: str, created: int, model: str, obj: str, usage: dict[str, Any]
) -> dict[str, Any]:
    """The final stream chunk of `stream_options.include_usage`: no choices, the usage."""
    return {
        "id": cid,
        "object": obj,
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [],
        "usage": usage,
    }


def now() -> int:
    """Unix seconds for `created`."""
    return int(time.time())
