"""Response models of the OpenAI-compatible routes, for the OpenAPI document: what the
builders in `openai_schemas.py` and the model catalog return (the routes build dicts; these
describe them, and the fuzz test checks every answer against them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptTokensDetails(_Out):
    """How many prompt tokens came from the prefix cache."""

    cached_tokens: int


class CompletionUsage(_Out):
    """Token counts of a request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprobOut(_Out):
    """One candidate: its text (`bytes:\\xNN` when part of a character) and bytes."""

    token: str
    logprob: float
    bytes: list[int]


class ChatLogprobOut(TopLogprobOut):
    """One generated token with its top candidates."""

    top_logprobs: list[TopLogprobOut]


class ChatChoiceLogprobs(_Out):
    """A chat choice's logprobs."""

    content: list[ChatLogprobOut]


class FunctionCallOut(_Out):
    """The function a tool call invokes: its name and JSON arguments."""

    name: str
    arguments: str


class ToolCallOut(_Out):
    """One tool call of the assistant message."""

    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(_Out):
    """The generated message: text, or tool calls (then content is null unless the model
    also wrote text outside them)."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Out):
    """One chat choice."""

    index: int
    message: AssistantMessage
    logprobs: ChatChoiceLogprobs | None
    finish_reason: str


class ChatCompletion(_Out):
    """`chat.completion` (with `"stream": true`, the body is a `text/event-stream` of
    `chat.completion.chunk` objects instead)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChoice]
    usage: CompletionUsage


class TextLogprobs(_Out):
    """A text choice's logprobs (legacy completions format)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoice(_Out):
    """One text choice."""

    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: str


class TextCompletion(_Out):
    """`text_completion` (a `text/event-stream` of chunks with `"stream": true`)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[TextChoice]
    usage: CompletionUsage


class ModelQuantization(_Out):
    """How a deployment stores the weights and the KV cache."""

    weights: str
    kv_cache: str


class ModelDeployment(_Out):
    """One deployment serving the model's base, and its quantization."""

    name: str
    quantization: ModelQuantization
    deterministic: bool = False
    # the deployment's speculative decoding (method, K bounds, draft model); None: off
    speculative: dict[str, Any] | None = None


class ModelObject(_Out):
    """A base model or one of the caller's adapters."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    deployments: list[ModelDeployment] | None = None


class ModelList(_Out):
    """`GET /v1/models`."""

    object: Literal["list"]
    data: list[ModelObject]


class UsageRow(_Out):
    """One day's totals for one model (adapter version or base model)."""

    day: str
    model: str
    adapter: str | None
    adapter_version: int | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    avg_latency_ms: float | None


class UsageList(_Out):
    """`GET /v1/usage`."""

    object: Literal["list"]
    data: list[UsageRow]


class BurstWindow(_Out):
    """The most requests any short window allows (`gateway/ratelimit.py`)."""

    limit: int
    seconds: int


class RateWindow(_Out):
    """A per-minute limit and what remains of it (requests: with their short window's cap,
    where it binds)."""

    limit: int
    remaining: int
    reset: str
    burst: BurstWindow | None = None


class MonthlyTokens(_Out):
    """The monthly token quota (null: none) and its use."""

    quota: int | None
    used: int
    remaining: int | None
    resets_at: str


class UploadSlots(_Out):
    """Concurrent uploads allowed and in progress."""

    limit: int
    in_progress: int
    remaining: int


class StoredBytes(_Out):
    """Stored adapter bytes allowed and used."""

    limit: int
    used: int
    remaining: int


class Limits(_Out):
    """`GET /v1/limits`."""

    object: Literal["limits"]
    requests_per_minute: RateWindow
    tokens_per_minute: RateWindow
    monthly_tokens: MonthlyTokens
    concurrent_uploads: UploadSlots | None = None
    stored_adapter_bytes: StoredBytes | None = None
