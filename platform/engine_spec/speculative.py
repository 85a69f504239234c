"""The `speculative` option of a deployment and an engine: method, K bounds, draft model.

Torch-free (the control plane validates a deployment's option with it); the engine turns it
into its `SpecConfig`. One canonical JSON text (`to_json`) is what `EngineConfig.speculative`
holds and what `--speculative` carries, so a command line round-trips.

Not served together with speculation: expert parallelism (EP follower ranks do not receive
drafts). Requests with structured output (a grammar) speculate exactly: by prompt lookup only,
drafts cut at the first token the grammar refuses, every verification row sampled under the
grammar's mask at its position (`engine/speculative/grammar_drafts.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

BUILT_METHODS = ("ngram", "draft_model", "draft_adapter")
PLANNED_METHODS = ("eagle", "medusa")
DRAFT_MODEL_METHODS = ("draft_model", "draft_adapter")
K_MAX_LIMIT = 16
_KEYS = ("method", "k_min", "k_max", "draft_model")


@dataclass(frozen=True)
class SpeculativeOption:
    """What speculation to run: `method` (ngram: prompt lookup plus each adapter's suffix
    table; draft_model: a small model sharing the tokenizer, at `draft_model`; draft_adapter:
    that model with the draft adapter tied to a request's adapter, else that adapter's suffix
    table, else the plain draft), K in [k_min, k_max] per request per step, and the draft model's location for the
    draft-model methods."""

    method: str = "ngram"
    k_min: int = 0
    k_max: int = 5
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.method in PLANNED_METHODS and self.method not in BUILT_METHODS:
            raise ValueError(
                f"speculative method {self.method!r} is not built yet; "
                f"built: {', '.join(BUILT_METHODS)}"
            )
        if self.method not in BUILT_METHODS:
            raise ValueError(
                f"unknown speculative method {self.method!r}; expected one of "
                f"{', '.join(BUILT_METHODS)}"
            )
        for name in ("k_min", "k_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"speculative {name} must be an integer, got {value!r}")
        if not 0 <= self.k_min <= self.k_max or not 1 <= self.k_max <= K_MAX_LIMIT:
            raise ValueError(
                f"speculative K bounds must satisfy 0 <= k_min <= k_max, 1 <= k_max <= "
                f"{K_MAX_LIMIT}; got k_min={self.k_min}, k_max={self.k_max}"
            )
        if self.method in DRAFT_MODEL_METHODS:
            if not isinstance(self.draft_model, str) or not self.draft_model:
                raise ValueError(f"speculative method {self.method!r} needs a draft_model")
        elif self.draft_model is not None:
            raise ValueError(
                f"speculative draft_model is only for {' and '.join(DRAFT_MODEL_METHODS)}, "
                f"not {self.method!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The option as a JSON object (draft_model left out when unset)."""
        out: dict[str, Any] = {"method": self.method, "k_min": self.k_min, "k_max": self.k_max}
        if self.draft_model is not None:
            out["draft_model"] = self.draft_model
        return out

    def to_json(self) -> str:
        """The canonical text: keys in one order, no spaces (what `--speculative` carries)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


def parse_speculative(value: str | dict[str, Any] | SpeculativeOption) -> SpeculativeOption:
    """A `speculative` option from its JSON text or object; ValueError naming what is wrong."""
    if isinstance(value, SpeculativeOption):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(
                f"speculative must be a JSON object such as "
                f'{{"method": "ngram", "k_max": 5}}, got {value!r}'
            ) from None
    if not isinstance(value, dict):
        raise ValueError(f"speculative must be a JSON object, got {value!r}")
    for key in value:
        if key not in _KEYS:
            raise ValueError(f"unknown speculative option {key!r}; expected {', '.join(_KEYS)}")
    return SpeculativeOption(**value)


def speculative_gap(option: SpeculativeOption, ep_size: int = 1) -> str | None:
    """What of this deployment speculation does not serve, None when it serves it all (the
    one rule: `EngineConfig` and the control plane both ask it)."""
    if ep_size > 1:
        return "expert parallelism (EP follower ranks do not receive drafts)"
    return None
