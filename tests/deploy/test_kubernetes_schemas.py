"""Every manifest of deploy/kubernetes is one the API server accepts: the Kubernetes objects
against the Kubernetes schemas (kubernetes-validate, offline, unknown fields refused), the
Prometheus Operator's objects against its CRDs' schemas (tests/deploy/data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.helpers.manifests import KUBERNETES, Manifest, kustomization, manifests

DATA = Path(__file__).with_name("data")
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): DATA / "servicemonitors.v1.schema.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): DATA / "prometheusrules.v1.schema.json",
}
# The oldest Kubernetes release still maintained when these were written, and the newest known.
VERSIONS = ["1.31.0", kubernetes_validate.latest_version()]

BUILT_IN = [m for m in manifests() if (m.body["apiVersion"], m.kind) not in CRD_SCHEMAS]
CUSTOM = [m for m in manifests() if (m.body["apiVersion"], m.kind) in CRD_SCHEMAS]


def ids(manifest: Manifest) -> str:
    return f"{manifest.kind}:{manifest.path.name}"


def test_the_kustomization_applies_every_manifest_of_the_directory() -> None:
    # GIVEN the YAML files next to kustomization.yaml
    files = {path.name for path in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    # THEN `kubectl apply -k` applies each of them, and nothing else
    assert sorted(kustomization()["resources"]) == sorted(files)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"k8s-{v}")
@pytest.mark.parametrize("manifest", BUILT_IN, ids=ids)
def test_kubernetes_objects_match_the_kubernetes_schema(manifest: Manifest, version: str) -> None:
    try:
        kubernetes_validate.validate(manifest.body, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = "/".join(str(part) for part in error.absolute_path)
        pytest.fail(f"{manifest.path.name}: {where}: {error.message}")


@pytest.mark.parametrize("manifest", CUSTOM, ids=ids)
def test_prometheus_operator_objects_match_their_crd_schema(manifest: Manifest) -> None:
    schema = strict(json.loads(CRD_SCHEMAS[manifest.body["apiVersion"], manifest.kind].read_text()))
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(manifest.body), key=lambda e: e.path
    )
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def test_a_misspelt_field_fails_the_crd_check() -> None:
    # GIVEN a ServiceMonitor with a field the CRD does not know (as a typo would make)
    (monitor,) = [m.body for m in CUSTOM if m.kind == "ServiceMonitor"]
    endpoint = {**monitor["spec"]["endpoints"][0], "intervall": "15s"}
    broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [endpoint]}}
    schema = strict(json.loads(CRD_SCHEMAS[monitor["apiVersion"], "ServiceMonitor"].read_text()))
    # THEN the check refuses it, as the API server's strict field validation does
    assert not jsonschema.Draft7Validator(schema).is_valid(broken)


def strict(schema: Any) -> Any:
    """The schema, refusing unknown fields wherever the CRD lists its fields and keeps no
    others (kubectl's default field validation refuses them there too)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict(value) for key, value in schema.items() if key != "properties"}
    if "properties" in schema:
        result["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            result["additionalProperties"] = False
    return result
