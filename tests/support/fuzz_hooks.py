"""Schemathesis hooks for the API fuzz test (loaded by `st run` through SCHEMATHESIS_HOOKS):
each call carries the admin key on `/admin/` and a tenant key elsewhere; chat and text
completion bodies name the stack's real base model half the time (so generation runs, not
only the 404 for an unknown model); and every 4xx must be an OpenAI error object."""

from __future__ import annotations

import os
from typing import Any

import schemathesis
from hypothesis import strategies as st

OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """The admin key for admin routes, the fuzz tenant's key for the rest."""
    admin = case.path.startswith("/admin/")
    key = os.environ["LORAPLEX_FUZZ_ADMIN_KEY" if admin else "LORAPLEX_FUZZ_TENANT_KEY"]
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    headers["Authorization"] = f"Bearer {key}"
    case.headers = headers


@schemathesis.hook("flatmap_body").apply_to(path_regex=r"completions$")
def real_model_sometimes(context: Any, body: Any) -> Any:
    """Half the completion bodies name the stack's base model."""
    if not isinstance(body, dict) or "model" not in body:
        return st.just(body)
    model = os.environ["LORAPLEX_FUZZ_MODEL"]
    return st.sampled_from([body, {**body, "model": model}])


@schemathesis.check
def openai_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx (and 5xx) body is `{"error": {message, type, param, code}}`."""
    if response.status_code < 400:
        return None
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"{response.status_code} answer is not JSON") from None
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict), f"{response.status_code} answer has no error object: {body!r}"
    assert set(error) >= OPENAI_ERROR_FIELDS, f"error object lacks fields: {error!r}"
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    return None
