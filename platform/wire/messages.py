"""The messages of the replica's internal API (see the package docstring for the rules).

    POST /generate        body GenerateRequest -> text/event-stream of `data: <event>` frames:
                          DeltaEvent* then exactly one FinishEvent, or an ErrorEvent
    POST /abort/{id}      -> AbortResult (404 ErrorBody when the id is not running)
    POST /adapters/warm   body WarmRequest -> WarmResult: fetch a version into the host tier
                          before its first request (the gateway, when the version turns ready)
    GET  /state           -> ReplicaState
    GET  /metrics         -> Prometheus text
    GET  /health          -> 200 while the engine loop runs (open: for probes)

Every non-2xx answer carries an `ErrorBody`. Sampling fields are the engine's
`SamplingParams` names; a field left out (None) takes the engine's default, so defaults live in
one place (`engine/sampling_params.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from loraplex.adapters.identity import adapter_ref_key
from loraplex.adapters.targets import ResolvedTargets

# The version as a type (the models' fields) and as a value (the header); mypy checks they agree.
WireVersion = Literal[1]
WIRE_VERSION: Final[WireVersion] = 1
WIRE_VERSION_HEADER = "x-loraplex-wire"
MAX_PROMPT_TOKENS = 1_000_000
MAX_STOP = 16
MAX_STOP_CHARS = 1024

_REQUEST_ID = r"^[A-Za-z0-9._:\-]{1,256}$"
_SHA256 = r"^[0-9a-fA-F]{64}$"


class WireModel(BaseModel):
    """Base: unknown fields refused, no type coercion ("3" is not 3), immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


StructuredVersion = Literal[1]
STRUCTURED_VERSION: Final[StructuredVersion] = 1
MAX_GRAMMAR_CHARS = 512 * 1024
MAX_CHOICES = 1024
MAX_LOGIT_BIAS = 1024


class StructuredOutput(WireModel):
    """A constraint on the whole output, compiled on the replica (cached by content).

    `kind` says how to read `value`: `json_schema` (a JSON Schema as JSON text), `json_object`
    (any JSON object; `value` empty), `regex` (a regular expression the output matches in
    full), `grammar` (a Lark grammar in llguidance's dialect); `choice` takes `choices` (the
    output is exactly one of them). `version` is this message's own version: a replica refuses
    a version it does not know instead of guessing."""

    version: StructuredVersion = STRUCTURED_VERSION
    kind: Literal["json_schema", "json_object", "regex", "grammar", "choice"]
    value: str = Field(default="", max_length=MAX_GRAMMAR_CHARS)
    choices: list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]] | None = Field(
        default=None, min_length=1, max_length=MAX_CHOICES
    )

    @model_validator(mode="after")
    def _check_fields(self) -> StructuredOutput:
        if (self.kind == "choice") != (self.choices is not None):
            raise ValueError("`choices` is given exactly when kind is 'choice'")
        if self.kind in ("json_schema", "regex", "grammar") and not self.value:
            raise ValueError(f"kind {self.kind!r} needs a non-empty `value`")
        if self.kind in ("json_object", "choice") and self.value:
            raise ValueError(f"kind {self.kind!r} takes no `value`")
        return self


class SamplingOptions(WireModel):
    """How to sample one sequence; None (or absent) = the engine's default for that field.

    Ranges are checked once, by the engine's `SamplingParams` (a bad value is a 400)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]] | None = Field(
        default=None, max_length=MAX_STOP
    )
    stop_token_ids: list[int] | None = Field(default=None, max_length=1024)
    include_stop_str_in_output: bool | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool | None = None
    # token id -> bias added to its logit (OpenAI's `logit_bias`, [-100, 100])
    logit_bias: dict[int, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    structured: StructuredOutput | None = None

    def engine_kwargs(self) -> dict[str, Any]:
        """The fields that were set, as `SamplingParams` keyword arguments."""
        return self.model_dump(exclude_none=True)


class StoredAdapter(WireModel):
    """An adapter's files in object storage: where they are and what they must hash to.

    `config_sha256` folds the config into the version's identity (two versions with equal
    weights but different scaling never share caches); `tenant` is for per-tenant fairness;
    `targets` are the version's targets as validation resolved them (module -> rank, alpha,
    scale: `adapters.targets.ResolvedTargets.to_json`), so the replica never runs a tenant's
    patterns (it refuses a reference without them)."""

    object_prefix: str = Field(min_length=1, max_length=1024)
    sha256: str = Field(pattern=_SHA256)
    config_sha256: str | None = Field(default=None, pattern=_SHA256)
    tenant: str | None = Field(default=None, max_length=256)
    targets: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """The engine-wide identity of this version (prefix cache, host and device tiers)."""
        return adapter_ref_key(self.sha256, self.config_sha256)

    def resolved_targets(self) -> ResolvedTargets:
        """The targets as the validation job resolved them (checked field by field)."""
        return ResolvedTargets.from_json(self.targets)

    def check(self) -> None:
        """What a replica needs beyond the field constraints above (which pydantic checked when
        the reference was built): no `..` segment in the prefix, and resolved targets that
        parse. Raises ValueError (AdapterFormatError for malformed targets)."""
        if ".." in self.object_prefix.split("/"):
            raise ValueError("adapter object_prefix must not contain '..'")
        if self.targets is None:
            raise ValueError(
                "the adapter reference carries no resolved targets (the version was validated "
                "before targets were recorded; the worker's recovery pass fills them in)"
            )
        self.resolved_targets()


MAX_DRAFT_ADAPTERS = 8


class DraftAdapterRef(StoredAdapter):
    """A draft adapter (issue 25): a LoRA for the draft model `draft_model` (a deployment's
    `speculative.draft_model`, as its replicas were given it), tied to the target adapter
    version that carries it. A replica uses the one whose `draft_model` is its own."""

    draft_model: str = Field(min_length=1, max_length=1024)


class AdapterRef(StoredAdapter):
    """An adapter version in object storage (see `StoredAdapter`), with the draft adapters tied
    to it (`drafts`, one per draft model; a replica drafting with another model ignores them)."""

    drafts: list[DraftAdapterRef] | None = Field(default=None, max_length=MAX_DRAFT_ADAPTERS)


class GenerateRequest(WireModel):
    """`POST /generate`: one sequence (n=1) from prompt token ids.

    The gateway tokenizes; the replica detokenizes and applies stop strings (see
    `loraplex.platform.tokenizing`). `cache_salt` partitions the prefix cache (the gateway
    derives it per tenant, `wire.auth.cache_salt`)."""

    request_id: str = Field(pattern=_REQUEST_ID)
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=1, max_length=MAX_PROMPT_TOKENS
    )
    sampling: SamplingOptions = SamplingOptions()
    adapter: AdapterRef | None = None
    cache_salt: str | None = Field(default=None, max_length=256)


class TopLogprob(WireModel):
    """One candidate token: id, its text (as logprobs show it) and its logprob."""

    token_id: int
    token: str
    logprob: float


class TokenLogprobs(WireModel):
    """A generated token's logprob and the top candidates (best first, at most `logprobs`)."""

    token_id: int
    token: str
    logprob: float
    top: list[TopLogprob]


class DeltaEvent(WireModel):
    """New output of one engine step: token ids, the text they complete (stop strings applied,
    a possible stop-string prefix held back), and logprobs when asked for."""

    type: Literal["delta"] = "delta"
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[list[TopLogprob] | None] | None = None


class Usage(WireModel):
    """Token counts of a finished sequence; `cached_tokens` came from the prefix cache."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


FinishReason = Literal["stop", "length", "abort"]


class FinishEvent(WireModel):
    """The last event of a stream that ended normally."""

    type: Literal["finish"] = "finish"
    finish_reason: FinishReason
    usage: Usage


class ErrorInfo(WireModel):
    """The OpenAI error object: what the API sends tenants and the replica sends the gateway."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEvent(WireModel):
    """The request failed after its stream began (the engine step raised)."""

    type: Literal["error"] = "error"
    error: ErrorInfo


class ErrorBody(WireModel):
    """The body of every non-2xx answer."""

    error: ErrorInfo


class AbortResult(WireModel):
    """`POST /abort/{request_id}`: the request will end (its KV blocks are freed)."""

    request_id: str
    aborted: bool
    # Prompt tokens the replica computed for it (prefix-cache hits excluded): what a client
    # that left before its first token is metered for.
    computed_prompt_tokens: int = Field(default=0, ge=0)


class WarmRequest(WireModel):
    """`POST /adapters/warm`: bring this adapter version into the replica's host tier now, so
    its first request pays no fetch from object storage."""

    adapter: AdapterRef


class WarmResult(WireModel):
    """What the replica did: `fetching` (started in the background), `on_host` or `resident`
    (nothing to do), `full` (its host tier has no free room: warming would evict an adapter
    in use, so it did not)."""

    outcome: Literal["fetching", "on_host", "resident", "full"]


class ColdStartPhase(WireModel):
    """One phase of a replica's cold start (header, fetch, device_copy, quantize, warmup,
    graph_capture): when it was first entered and how long it took, in seconds from the start
    of loading. A phase entered several times, or from several threads, sums its intervals."""

    name: str = Field(min_length=1, max_length=64)
    start_s: float = Field(ge=0.0)
    seconds: float = Field(ge=0.0)


class AdapterAcceptance(WireModel):
    """Speculation's acceptance for one adapter (None: the base model) since the replica
    started: verifications run, tokens drafted and accepted, tokens emitted per verification."""

    adapter: str | None
    verifications: int = Field(ge=0)
    drafted_tokens: int = Field(ge=0)
    accepted_tokens: int = Field(ge=0)
    mean_acceptance_length: float = Field(ge=0.0)


class SpeculativeState(WireModel):
    """The speculative decoding a replica runs (its `speculative` option) and its acceptance
    per adapter. Requests with structured output draft by prompt lookup only."""

    method: str
    k_min: int = Field(ge=0)
    k_max: int = Field(ge=1)
    draft_model: str | None = None
    acceptance: list[AdapterAcceptance] = Field(default_factory=list)


class ReplicaState(WireModel):
    """`GET /state`: what the router scores, and what it needs to predict the prefix cache.

    `kv_cache_usage` is the fraction (0..1) of KV blocks in use (`num_blocks -
    num_free_blocks` of them), `adapter_references` the device-slot references running
    requests hold (both 0 when idle); `model_id`, `block_size` and
    `prefix_caching` are the inputs of the replica's block hashes (`wire.prefix_hash`)."""

    wire_version: WireVersion
    model_id: str
    block_size: int = Field(ge=1)
    prefix_caching: bool
    num_blocks: int = Field(ge=0)
    num_free_blocks: int = Field(ge=0)
    kv_cache_usage: float = Field(ge=0.0, le=1.0)
    num_requests_running: int = Field(ge=0)
    num_requests_waiting: int = Field(ge=0)
    resident_adapters: list[str]
    adapter_references: int = Field(default=0, ge=0)  # held by running requests
    max_loras: int = Field(ge=0)
    prefix_cache_queries: int = Field(ge=0)
    prefix_cache_hits: int = Field(ge=0)
    num_preemptions: int = Field(ge=0)
    # memory accounting: how the deployment's quantization choices spend the device
    weight_quantization: str = "none"
    weight_bytes: int = Field(default=0, ge=0)
    kv_cache_dtype: str = "auto"
    kv_cache_bytes: int = Field(default=0, ge=0)
    # The dtype the model computes in and why ("auto" picks bf16 only where it is native).
    compute_dtype: str = "float32"
    compute_dtype_reason: str = ""
    # Whether the replica runs the deterministic mode (batch-invariant kernels, issue 23).
    deterministic: bool = False
    # The speculative decoding it runs and its acceptance per adapter (issue 25); None: off.
    speculative: SpeculativeState | None = None
    # The replica's cold start (phases in order, and the wall time to ready); empty and 0 from
    # a replica that does not report it.
    cold_start: list[ColdStartPhase] = Field(default_factory=list)
    cold_start_seconds: float = Field(default=0.0, ge=0.0)


StreamEvent = Annotated[DeltaEvent | FinishEvent | ErrorEvent, Field(discriminator="type")]
_EVENTS: TypeAdapter[DeltaEvent | FinishEvent | ErrorEvent] = TypeAdapter(StreamEvent)


def encode_event(event: DeltaEvent | FinishEvent | ErrorEvent) -> bytes:
    """One SSE frame: `data: <json>` and a blank line."""
    return b"data: " + event.model_dump_json().encode() + b"\n\n"


def decode_event(data: str | bytes) -> DeltaEvent | FinishEvent | ErrorEvent:
    """Parse the JSON after `data: ` (raises pydantic's ValidationError when it is not one)."""
    return _EVENTS.validate_json(data)
