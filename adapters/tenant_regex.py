"""Tenant-supplied regular expressions, run on RE2 (linear time: no pattern can stall a CPU).

PEFT matches `target_modules`, `rank_pattern`, `alpha_pattern` and `layers_pattern` with
Python's backtracking `re`; a pattern such as `(.+)+X` then takes exponential time. Here every
tenant pattern is compiled by RE2 and only ever run by RE2. A pattern is accepted only when
Python's `re` would accept it too (so PEFT could load the adapter) and RE2 means the same
thing by it: backreferences, lookaround, atomic groups and possessive quantifiers are refused
(RE2 cannot run them in linear time), as are the few constructs the two engines read
differently. Compiling with `re` only checks syntax; no tenant pattern is ever *matched* by it.

Only the validation job uses this module: it resolves an adapter's targets once, against the
base model's finite list of module names; replicas get the resolved list, never the patterns.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import re2

MAX_PATTERN_CHARS = 1024
"""Longest tenant pattern accepted (a config field or a composed PEFT pattern's tenant part)."""

RE2_MAX_MEM = 8 << 20
"""RE2's compile budget in bytes: a pattern whose automaton needs more is refused."""

# Constructs both engines compile but read differently (RE2 has POSIX classes `[[:alpha:]]`
# and treats `{,n}` as literal text; Python reads `[[:` as a set and `{,n}` as `{0,n}`).
_AMBIGUOUS = (("[:", "a POSIX character class such as [[:alpha:]]"), ("{,", "a '{,n}' repeat"))


class TenantPatternError(ValueError):
    """A tenant pattern is refused; the message says which and why (fit for the uploader)."""


def _options() -> Any:
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = RE2_MAX_MEM
    return opts


def _python_syntax_error(pattern: str) -> str | None:
    """Why Python's `re` refuses `pattern` (PEFT could not load it), or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FutureWarning "possible nested set" and friends
        try:
            re.compile(pattern)
        except (re.error, FutureWarning, DeprecationWarning, RecursionError, OverflowError) as exc:
            return str(exc) or type(exc).__name__
    return None


def compile_pattern(pattern: Any, what: str) -> Any:
    """Compile a tenant pattern for RE2 after checking it means the same under Python's `re`.

    `what` names the field for the message ("target_modules", "rank_pattern key 'q'", ...).
    Raises TenantPatternError; returns an RE2 regexp.
    """
    if not isinstance(pattern, str):
        raise TenantPatternError(f"{what} must be a string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise TenantPatternError(
            f"{what} is too long ({len(pattern)} characters, at most {MAX_PATTERN_CHARS})"
        )
    for token, name in _AMBIGUOUS:
        if token in pattern:
            raise TenantPatternError(
                f"{what} uses {name}, which Python's re (what PEFT runs) and RE2 read differently"
            )
    reason = _python_syntax_error(pattern)
    if reason is not None:
        raise TenantPatternError(
            f"{what} is not a valid regular expression for PEFT (Python re): {reason}"
        )
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        raw = exc.args[0] if exc.args else b""
        detail = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        raise TenantPatternError(
            f"{what} cannot run in linear time (RE2 refuses it: {detail}); backreferences, "
            "lookahead/lookbehind, atomic groups and possessive quantifiers are not supported"
        ) from None


def check_pattern(pattern: Any, what: str) -> None:
    """Refuse a pattern `compile_pattern` would refuse (for config parsing at upload)."""
    compile_pattern(pattern, what)
