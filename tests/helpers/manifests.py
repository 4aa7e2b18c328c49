"""The Kubernetes manifests of deploy/kubernetes, read as Kubernetes reads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
CONTAINER = REPO / "deploy" / "container"
KUSTOMIZATION = KUBERNETES / "kustomization.yaml"


@dataclass(frozen=True)
class Manifest:
    path: Path
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])


def kustomization() -> dict[str, Any]:
    return yaml.safe_load(KUSTOMIZATION.read_text())


def manifests() -> list[Manifest]:
    """Every object of every file the kustomization applies."""
    found = []
    for name in kustomization()["resources"]:
        path = KUBERNETES / name
        found += [Manifest(path, body) for body in yaml.safe_load_all(path.read_text()) if body]
    return found


def one(kind: str) -> dict[str, Any]:
    (body,) = [manifest.body for manifest in manifests() if manifest.kind == kind]
    return body


def pod_spec() -> dict[str, Any]:
    return one("DaemonSet")["spec"]["template"]["spec"]


def daemon_container() -> dict[str, Any]:
    (container,) = pod_spec()["containers"]
    return container
