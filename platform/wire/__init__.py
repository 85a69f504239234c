"""The gateway <-> replica contract: one versioned, torch-free definition both sides import.

`loraplex.platform.engine.server` (the replica) and `loraplex.platform.gateway.replica_client`
(the gateway) speak only these types; every model refuses unknown fields and nothing is
parsed tolerantly, so a change on one side that the other does not know fails loudly instead
of being guessed around.

- `messages.py`: `POST /generate` (`GenerateRequest`), its SSE stream (`DeltaEvent`,
  `FinishEvent`, `ErrorEvent`), `POST /abort/{id}` (`AbortResult`), error bodies, and
  `GET /state` (`ReplicaState`), `POST /adapters/warm` (`WarmRequest`, `WarmResult`).
- `prefix_hash.py`: the KV block hashes the replica's prefix cache keys by; the router
  computes the same ones to predict what each replica holds.
- `auth.py`: the shared replica secret (bearer header, constant-time check) and the
  per-tenant prefix-cache salt (an HMAC of the tenant id under that secret).

`WIRE_VERSION` travels in the `x-loraplex-wire` header of every request and response (and
in `/state`); a replica refuses a request of another version, and the gateway refuses a
replica that answers with another.
"""

from loraplex.platform.wire.messages import (
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    AbortResult,
    AdapterRef,
    ColdStartPhase,
    DeltaEvent,
    DraftAdapterRef,
    ErrorBody,
    ErrorEvent,
    ErrorInfo,
    FinishEvent,
    FinishReason,
    GenerateRequest,
    ReplicaState,
    SamplingOptions,
    StreamEvent,
    StructuredOutput,
    TokenLogprobs,
    TopLogprob,
    Usage,
    WarmRequest,
    WarmResult,
    decode_event,
    encode_event,
)

__all__ = [
    "WIRE_VERSION",
    "WIRE_VERSION_HEADER",
    "AbortResult",
    "AdapterRef",
    "ColdStartPhase",
    "DeltaEvent",
    "DraftAdapterRef",
    "ErrorBody",
    "ErrorEvent",
    "ErrorInfo",
    "FinishEvent",
    "FinishReason",
    "GenerateRequest",
    "ReplicaState",
    "SamplingOptions",
    "StreamEvent",
    "StructuredOutput",
    "TokenLogprobs",
    "TopLogprob",
    "Usage",
    "WarmRequest",
    "WarmResult",
    "decode_event",
    "encode_event",
]
