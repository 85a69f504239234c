"""The OpenAPI document: what FastAPI derives from the routes, plus what it cannot see.

- Request bodies of the routes that read their own body: the OpenAI routes (they limit and
  parse the raw JSON themselves, to answer in OpenAI's error shape) and the multipart upload.
- Errors: every operation answers 4xx in OpenAI's shape (`ErrorResponse`), FastAPI's 422
  (parameters that fail validation) included.
- Security: the admin key on `/admin/`, a tenant key everywhere else but `/healthz`.
- Links: a created tenant -> its keys, a key -> its revocation, an upload -> the adapter, its
  version and the completion of a presigned upload (so a stateful fuzzer reaches them).
Operation ids are the route functions' names (`create_tenant`, `get_version`, ...).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel

from loraplex.platform.gateway.openai_schemas import ChatCompletionRequest, CompletionRequest

from .response_models import ErrorResponse

REF = "#/components/schemas/{model}"
ERROR_STATUSES = {
    "400": "Invalid input",
    "401": "Missing, unknown or revoked key",
    "403": "The key lacks the scope",
    "404": "No such resource (or not the caller's)",
    "409": "Conflicts with the resource's state",
    "413": "Body too large",
    "422": "Parameters that fail validation",
    "429": "Rate limit, quota or upload limit reached",
    "503": "A backend (database, storage, replicas) is unavailable; retry",
}
OPENAI_BODIES: dict[str, type[BaseModel]] = {
    "chat_completions": ChatCompletionRequest,
    "adapter_chat_completions": ChatCompletionRequest,
    "completions": CompletionRequest,
    "adapter_completions": CompletionRequest,
}
UPLOAD_FORM = {
    "type": "object",
    "required": ["name", "base_model", "adapter_config", "adapter_model"],
    "properties": {
        "name": {"type": "string", "maxLength": 128},
        "base_model": {"type": "string", "maxLength": 128},
        "adapter_config": {"type": "string", "format": "binary"},
        "adapter_model": {"type": "string", "format": "binary"},
    },
}


def _link(operation: str, **parameters: str) -> dict[str, Any]:
    return {"operationId": operation, "parameters": parameters}


_VERSION = {"name": "$response.body#/name", "n": "$response.body#/version"}
_ADAPTER = {"name": "$response.body#/name"}
LINKS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("create_tenant", "201"): {
        "GetTenant": _link("get_tenant", tenant_id="$response.body#/id"),
        "UpdateTenant": _link("update_tenant", tenant_id="$response.body#/id"),
        "CreateApiKey": _link("create_api_key", tenant_id="$response.body#/id"),
        "ListApiKeys": _link("list_api_keys", tenant_id="$response.body#/id"),
    },
    ("create_api_key", "201"): {
        "RevokeApiKey": _link("revoke_api_key", key_id="$response.body#/id"),
        "ListApiKeys": _link("list_api_keys", tenant_id="$response.body#/tenant_id"),
    },
    ("upload_adapter", "202"): {
        "GetAdapter": _link("get_adapter", **_ADAPTER),
        "GetVersion": _link("get_version", **_VERSION),
        "DeleteAdapter": _link("delete_adapter", **_ADAPTER),
    },
    ("start_upload", "201"): {
        "CompleteUpload": _link(
            "complete_upload", name="$response.body#/name", upload_id="$response.body#/upload_id"
        ),
        "GetAdapter": _link("get_adapter", **_ADAPTER),
        "GetVersion": _link("get_version", **_VERSION),
    },
    ("complete_upload", "202"): {
        "GetVersion": _link("get_version", **_VERSION),
        "GetAdapter": _link("get_adapter", **_ADAPTER),
    },
    ("list_base_models", "200"): {
        "GetModel": _link("get_model", model_id="$response.body#/data/0/name"),
    },
    ("list_adapters", "200"): {
        "GetAdapter": _link("get_adapter", name="$response.body#/data/0/name"),
        "AdapterChat": _link("adapter_chat_completions", name="$response.body#/data/0/name"),
        "AdapterText": _link("adapter_completions", name="$response.body#/data/0/name"),
    },
    ("get_adapter", "200"): {
        "GetVersion": _link(
            "get_version", name="$response.body#/name", n="$response.body#/version"
        ),
        "DeleteAdapter": _link("delete_adapter", **_ADAPTER),
    },
}


def operation_id(route: APIRoute) -> str:
    """A route's operation id: its function's name (unique across the app)."""
    return route.name


def _add_models(schemas: dict[str, Any], *models: type[BaseModel]) -> None:
    for model in models:
        js = model.model_json_schema(ref_template=REF)
        schemas.update(js.pop("$defs", {}))
        schemas[model.__name__] = js


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _complete(op: dict[str, Any], path: str) -> None:
    """Fill in what FastAPI cannot derive for one operation."""
    name = op["operationId"]
    if name in OPENAI_BODIES:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(OPENAI_BODIES[name])}},
        }
        ok = op["responses"].setdefault("200", {"description": "Successful Response"})
        ok.setdefault("content", {})["text/event-stream"] = {
            "schema": {"type": "string", "description": "SSE chunks when `stream` is true"}
        }
    if name == "upload_adapter":
        op["requestBody"] = {
            "required": True,
            "content": {"multipart/form-data": {"schema": UPLOAD_FORM}},
        }
    responses = op["responses"]
    responses.pop("422", None)  # FastAPI's placeholder names its own error body
    error = {"application/json": {"schema": _ref(ErrorResponse)}}
    for status, description in ERROR_STATUSES.items():
        if path == "/healthz" and status != "503":
            continue
        responses.setdefault(status, {"description": description, "content": error})
    for (operation, status), links in LINKS.items():
        if operation == name and status in responses:
            responses[status]["links"] = links
    if path.startswith("/admin/"):
        op["security"] = [{"AdminKey": []}]
    elif path != "/healthz":
        op["security"] = [{"TenantKey": []}]


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document (cached on the app, as FastAPI does)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _add_models(schemas, ChatCompletionRequest, CompletionRequest, ErrorResponse)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    components["securitySchemes"] = {
        "AdminKey": {"type": "http", "scheme": "bearer", "description": "The admin key"},
        "TenantKey": {"type": "http", "scheme": "bearer", "description": "A tenant's API key"},
    }
    for path, item in doc["paths"].items():
        for op in item.values():
            _complete(op, path)
    app.openapi_schema = doc
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve `build_openapi` at `/openapi.json`."""
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]  # FastAPI's documented override
