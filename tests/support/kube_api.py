"""A recording stand-in for the Kubernetes API server (no cluster is reachable here): a real
HTTP server on loopback that the official `kubernetes` client talks to. It records every
request (method, path, query, content type, JSON body, whether the object existed), answers
GETs with the objects it holds, and 404 for anything it does not hold.

Server-side apply follows the documented field ownership for the one field two controllers
share, a Deployment's `spec.replicas` (https://kubernetes.io/docs/reference/using-api/server-side-apply/,
"Field management", "Transferring ownership"): an apply takes ownership of the fields it sets
(with force, from any other manager); a field an apply no longer sets is removed when no other
manager owns it (a Deployment's `replicas` then defaults to 1); a write of the `scale`
subresource (what an HPA, hence KEDA, sends) takes the field over for its own manager."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Call:
    """One request the client sent."""

    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any
    existed: bool = False


class KubeApi:
    """`with KubeApi() as api:` then point `kubernetes.client.Configuration.host` at `api.url`;
    `api.objects[path]` are what GETs answer; `api.calls` what was sent."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.objects: dict[str, Any] = {}
        # path -> the managers owning a Deployment's spec.replicas
        self.replica_owners: dict[str, set[str]] = {}
        # path -> manager -> its last applied configuration
        self.applied: dict[str, dict[str, Any]] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = parse_qs(parts.query)
                target = parts.path.removesuffix("/scale")
                owner.calls.append(Call(self.command, parts.path, query,
                                        self.headers.get("content-type", ""), body,
                                        target in owner.objects))  # fmt: skip
                if self.command == "PATCH":
                    manager = query.get("fieldManager", ["unknown"])[0]
                    self._send(200, owner._apply(parts.path, body, manager))
                elif (
                    self.command == "PUT"
                    and parts.path.endswith("/scale")
                    and target in owner.objects
                ):
                    manager = query.get("fieldManager", ["horizontal-pod-autoscaler"])[0]
                    owner.objects[target]["spec"]["replicas"] = body["spec"]["replicas"]
                    owner.replica_owners[target] = {manager}
                    self._send(200, body)
                elif self.command == "DELETE" and parts.path in owner.objects:
                    del owner.objects[parts.path]
                    owner.replica_owners.pop(parts.path, None)
                    owner.applied.pop(parts.path, None)
                    self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                elif self.command == "GET" and parts.path in owner.objects:
                    self._send(200, owner.objects[parts.path])
                else:
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": "NotFound", "code": 404})  # fmt: skip

            def _send(self, status: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _handle  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _apply(self, path: str, body: dict[str, Any], manager: str) -> dict[str, Any]:
        """Server-side apply of `body` by `manager`: the object is every manager's last applied
        configuration merged, and a Deployment's spec.replicas follows its documented owners."""
        configs = self.applied.setdefault(path, {})
        configs[manager] = json.loads(json.dumps(body))
        new: dict[str, Any] = {}
        for config in configs.values():
            _merge(new, json.loads(json.dumps(config)))
        if body.get("kind") == "Deployment":
            owners = self.replica_owners.setdefault(path, set())
            old = self.objects.get(path) or {}
            if "replicas" in body.get("spec", {}):
                owners.clear()  # force: the applier takes the field from every other manager
                owners.add(manager)
                value = body["spec"]["replicas"]
            else:
                owners.discard(manager)
                value = old.get("spec", {}).get("replicas", 1) if owners else 1
            new.setdefault("spec", {})["replicas"] = value
            new.setdefault("metadata", {})["managedFields"] = [
                {"manager": m, "operation": "Apply" if m in configs else "Update",
                 "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}}
                for m in sorted(owners)
            ]  # fmt: skip
        self.objects[path] = new
        return new

    def scale_by_autoscaler(self, path: str, replicas: int) -> None:
        """What KEDA's HPA does: write the Deployment's scale subresource."""
        import urllib.request

        req = urllib.request.Request(
            f"{self.url}{path}/scale?fieldManager=horizontal-pod-autoscaler", method="PUT",
            data=json.dumps({"kind": "Scale", "apiVersion": "autoscaling/v1",
                             "spec": {"replicas": replicas}}).encode(),
            headers={"content-type": "application/json"},
        )  # fmt: skip
        urllib.request.urlopen(req, timeout=10).close()

    def __enter__(self) -> KubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` talking to this server."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return client.ApiClient(config)


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """Deep-merge `update` into `into` (maps merge, anything else replaces)."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def rbac_permissions(call: Call) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) triples RBAC must allow for one namespaced request.

    The request verb follows https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb
    (GET on a name: get, on a collection: list; PATCH: patch; DELETE: delete; PUT: update;
    POST: create). A server-side apply (a PATCH of type application/apply-patch+yaml) of an
    object that does not exist creates it, and the API server then also authorizes `create`
    (https://kubernetes.io/docs/reference/using-api/server-side-apply/ "apply ... creates the
    object if it does not exist"; kube-apiserver's patch handler checks the create attributes
    through `withAuthorization` before it creates): apply of a missing object needs patch and
    create, of an existing one patch only."""
    parts = [unquote(p) for p in call.path.strip("/").split("/")]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    assert rest[0] == "namespaces", call.path
    resource, name = rest[2], (rest[3] if len(rest) > 3 else None)
    if len(rest) > 4:  # a subresource: deployments/scale
        resource = f"{resource}/{rest[4]}"
    if call.method == "GET":
        verbs = {"get" if name else "list"}
    else:
        verbs = {{"PATCH": "patch", "DELETE": "delete", "POST": "create", "PUT": "update"}[
            call.method]}  # fmt: skip
    if call.method == "PATCH" and "apply-patch" in call.content_type and not call.existed:
        verbs.add("create")
    return {(group, resource, verb) for verb in verbs}
