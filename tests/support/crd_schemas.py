"""JSON Schemas for the custom resources the manifests use, which kubernetes-validate has no
schema for (it knows built-in kinds only). Written from the projects' API references (KEDA
v2 ScaledObject, External Secrets v1, Prometheus Operator v1 PodMonitor, Karpenter v1 NodePool
and EC2NodeClass); they cover the
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


CLUSTER_METADATA = _obj({"name": STR, "labels": {"type": "object"},
                         "annotations": {"type": "object"}}, ["name"])  # fmt: skip
REQUIREMENT = _obj({"key": STR, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist",
                    "Gt", "Lt"]}, "values": {"type": "array", "items": STR}}, ["key", "operator"])  # fmt: skip
TAINT = _obj({"key": STR, "value": STR, "effect": {"enum": ["NoSchedule", "PreferNoSchedule",
              "NoExecute"]}}, ["key", "effect"])  # fmt: skip
DURATION = {"type": "string", "pattern": "^(([0-9]+(s|m|h))+|Never)$"}
SELECTOR_TERMS = {"type": "array", "minItems": 1, "items": _obj({"tags": {"type": "object",
                  "additionalProperties": STR}, "id": STR})}  # fmt: skip


def _cluster_resource(api: str, kind: str, spec: dict) -> dict:
    return _obj({"apiVersion": {"const": api}, "kind": {"const": kind},
                 "metadata": CLUSTER_METADATA, "spec": spec},
                ["apiVersion", "kind", "metadata", "spec"])  # fmt: skip


SCHEMAS[("karpenter.sh/v1", "NodePool")] = _cluster_resource("karpenter.sh/v1", "NodePool", _obj({
    "template": _obj({
        "metadata": _obj({"labels": {"type": "object", "additionalProperties": STR},
                          "annotations": {"type": "object"}}),
        "spec": _obj({
            "nodeClassRef": _obj({"group": STR, "kind": STR, "name": STR}, ["group", "kind", "name"]),
            "taints": {"type": "array", "items": TAINT},
            "startupTaints": {"type": "array", "items": TAINT},
            "requirements": {"type": "array", "items": REQUIREMENT},
            "expireAfter": DURATION,
            "terminationGracePeriod": DURATION,
        }, ["nodeClassRef", "requirements"]),
    }, ["spec"]),
    "disruption": _obj({
        "consolidationPolicy": {"enum": ["WhenEmpty", "WhenEmptyOrUnderutilized"]},
        "consolidateAfter": DURATION,
        "budgets": {"type": "array", "items": _obj({"nodes": STR, "schedule": STR,
                                                    "duration": STR, "reasons": {"type": "array"}},
                                                   ["nodes"])},
    }, ["consolidateAfter"]),
    "limits": {"type": "object", "additionalProperties": STR},
    "weight": {"type": "integer", "minimum": 1, "maximum": 100},
}, ["template"]))  # fmt: skip

SCHEMAS[("karpenter.k8s.aws/v1", "EC2NodeClass")] = _cluster_resource(
    "karpenter.k8s.aws/v1", "EC2NodeClass", _obj({
        "role": {"type": "string", "minLength": 1},
        "instanceProfile": STR,
        "amiSelectorTerms": {"type": "array", "minItems": 1, "items": _obj({
            "alias": {"type": "string", "pattern": "^(al2023|al2|bottlerocket|windows2019|windows2022)@(latest|v[0-9]+)$"},
            "id": STR, "tags": {"type": "object"}})},
        "subnetSelectorTerms": SELECTOR_TERMS,
        "securityGroupSelectorTerms": SELECTOR_TERMS,
        "metadataOptions": _obj({"httpEndpoint": {"enum": ["enabled", "disabled"]},
                                 "httpTokens": {"enum": ["required", "optional"]},
                                 "httpProtocolIPv6": {"enum": ["enabled", "disabled"]},
                                 "httpPutResponseHopLimit": {"type": "integer", "minimum": 1}}),
        "blockDeviceMappings": {"type": "array", "items": _obj({"deviceName": STR, "rootVolume": {"type": "boolean"},
            "ebs": _obj({"volumeSize": STR, "volumeType": STR, "encrypted": {"type": "boolean"},
                         "deleteOnTermination": {"type": "boolean"}, "iops": INT, "throughput": INT,
                         "kmsKeyID": STR})})},
    }, ["amiSelectorTerms", "subnetSelectorTerms", "securityGroupSelectorTerms"]))  # fmt: skip
