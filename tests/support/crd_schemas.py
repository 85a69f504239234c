"""JSON Schemas for the custom resources the manifests use, which kubernetes-validate has no
schema for (it knows built-in kinds only). Written from the projects' API references (KEDA
v2 ScaledObject, External Secrets v1, Prometheus Operator v1 PodMonitor); they cover the
fields the templates use and refuse unknown ones at the levels the templates write."""

from __future__ import annotations

from typing import Any


def _obj(props: dict[str, Any], required: list[str] | None = None, *, closed: bool = True) -> dict:
    return {"type": "object", "properties": props, "required": required or [],
            "additionalProperties": not closed}  # fmt: skip


STR = {"type": "string"}
INT = {"type": "integer"}
METADATA = _obj({"name": STR, "namespace": STR, "labels": {"type": "object"},
                 "annotations": {"type": "object"}}, ["name", "namespace"])  # fmt: skip
REMOTE_REF = _obj({"key": STR, "property": STR}, ["key"])
STORE_REF = _obj({"kind": {"enum": ["SecretStore", "ClusterSecretStore"]}, "name": STR}, ["name"])


def _resource(api: str, kind: str, spec: dict) -> dict:
    return _obj({"apiVersion": {"const": api}, "kind": {"const": kind}, "metadata": METADATA,
                 "spec": spec}, ["apiVersion", "kind", "metadata", "spec"])  # fmt: skip


SCHEMAS: dict[tuple[str, str], dict] = {
    ("keda.sh/v1alpha1", "ScaledObject"): _resource(
        "keda.sh/v1alpha1",
        "ScaledObject",
        _obj(
            {
                "scaleTargetRef": _obj({"apiVersion": STR, "kind": STR, "name": STR}, ["name"]),
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": INT,
                "cooldownPeriod": INT,
                "advanced": _obj(
                    {"horizontalPodAutoscalerConfig": _obj({"behavior": {"type": "object"}})}
                ),
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": _obj(
                        {
                            "type": STR,
                            "metadata": {"type": "object", "additionalProperties": STR},
                        },
                        ["type", "metadata"],
                    ),
                },
            },
            ["scaleTargetRef", "triggers"],
        ),
    ),
    ("external-secrets.io/v1", "SecretStore"): _resource(
        "external-secrets.io/v1",
        "SecretStore",
        _obj(
            {
                "provider": _obj(
                    {
                        "aws": _obj(
                            {
                                "service": {"enum": ["SecretsManager", "ParameterStore"]},
                                "region": STR,
                                "auth": _obj(
                                    {
                                        "jwt": _obj(
                                            {"serviceAccountRef": _obj({"name": STR}, ["name"])},
                                            ["serviceAccountRef"],
                                        )
                                    }
                                ),
                            },
                            ["service", "region"],
                        )
                    },
                    ["aws"],
                ),
            },
            ["provider"],
        ),
    ),
    ("external-secrets.io/v1", "ExternalSecret"): _resource(
        "external-secrets.io/v1",
        "ExternalSecret",
        _obj(
            {
                "refreshInterval": STR,
                "secretStoreRef": STORE_REF,
                "target": _obj(
                    {
                        "name": STR,
                        "creationPolicy": {"enum": ["Owner", "Orphan", "Merge", "None"]},
                        "template": _obj(
                            {
                                "engineVersion": {"const": "v2"},
                                "data": {"type": "object", "additionalProperties": STR},
                            }
                        ),
                    },
                    ["name"],
                ),
                "data": {
                    "type": "array",
                    "minItems": 1,
                    "items": _obj(
                        {"secretKey": STR, "remoteRef": REMOTE_REF}, ["secretKey", "remoteRef"]
                    ),
                },
            },
            ["secretStoreRef", "target", "data"],
        ),
    ),
    ("monitoring.coreos.com/v1", "PodMonitor"): _resource(
        "monitoring.coreos.com/v1",
        "PodMonitor",
        _obj(
            {
                "selector": _obj({"matchLabels": {"type": "object"}}),
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _obj(
                        {
                            "port": STR,
                            "path": STR,
                            "interval": STR,
                            "authorization": _obj(
                                {
                                    "type": STR,
                                    "credentials": _obj(
                                        {"name": STR, "key": STR, "optional": {"type": "boolean"}},
                                        ["key"],
                                    ),
                                }
                            ),
                            "relabelings": {
                                "type": "array",
                                "items": _obj(
                                    {
                                        "sourceLabels": {"type": "array", "items": STR},
                                        "targetLabel": STR,
                                    }
                                ),
                            },
                        },
                        ["port"],
                    ),
                },
            },
            ["selector", "podMetricsEndpoints"],
        ),
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _resource(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        _obj(
            {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": _obj(
                        {
                            "name": STR,
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": _obj(
                                    {
                                        "alert": STR,
                                        "expr": STR,
                                        "for": STR,
                                        "labels": {"type": "object", "additionalProperties": STR},
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": STR,
                                        },
                                    },
                                    ["alert", "expr"],
                                ),
                            },
                        },
                        ["name", "rules"],
                    ),
                }
            },
            ["groups"],
        ),
    ),
}
