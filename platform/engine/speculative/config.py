"""SpecConfig: what speculation an engine runs (method and K bounds); the one place its
defaults live. The methods built and planned are engine_spec's (one list for the control plane
and the engine)."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.platform.engine_spec.speculative import (
    BUILT_METHODS,
    DRAFT_MODEL_METHODS,
    PLANNED_METHODS,
    SpeculativeOption,
)


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings: `method` ("ngram": prompt lookup plus the adapter's suffix table;
    "draft_model": the small model at `draft_model`), K in [k_min, k_max] chosen per request
    per step by the controller, and the n-gram lengths the lookup tries (longest first)."""

    method: str = "ngram"
    draft_model: str | None = None
    k_min: int = 0
    k_max: int = 5
    ngram_min: int = 2
    ngram_max: int = 4
    adapter_tables: bool = True
    adapter_table_tokens: int = 1 << 16
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.method in PLANNED_METHODS and self.method not in BUILT_METHODS:
            raise NotImplementedError(
                f"speculative method {self.method!r} is not built yet; built: "
                f"{', '.join(BUILT_METHODS)}"
            )
        if self.method not in BUILT_METHODS:
            raise ValueError(
                f"unknown speculative method {self.method!r}; expected {', '.join(BUILT_METHODS)}"
            )
        if (self.method in DRAFT_MODEL_METHODS) != (self.draft_model is not None):
            raise ValueError(
                "a draft_model is given with method 'draft_model' or 'draft_adapter', and only then"
            )
        if not 0 <= self.k_min <= self.k_max or self.k_max < 1 or self.k_max > 16:
            raise ValueError(
                f"K bounds must satisfy 0 <= k_min <= k_max, 1 <= k_max <= 16; "
                f"got k_min={self.k_min}, k_max={self.k_max}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max <= 8:
            raise ValueError(
                f"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 8; "
                f"got {self.ngram_min}, {self.ngram_max}"
            )
        if self.adapter_table_tokens < 1024:
            raise ValueError("adapter_table_tokens must be >= 1024")

    @classmethod
    def from_option(cls, option: SpeculativeOption) -> SpecConfig:
        """The engine's settings for a deployment's `speculative` option (the rest default)."""
        return cls(
            method=option.method,
            k_min=option.k_min,
            k_max=option.k_max,
            draft_model=option.draft_model,
        )
