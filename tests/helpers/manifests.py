"""The Kubernetes manifests of deploy/kubernetes, read as Kubernetes reads them; what
kustomize makes of them with a component (where kubectl is here); and which peers a
NetworkPolicy admits."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
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


def container(name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec()["containers"] if c["name"] == name]
    return found


def daemon_container() -> dict[str, Any]:
    return container("gpuwatch")


def relay_container() -> dict[str, Any]:
    """The relay to the kubelet's pod-resources socket."""
    return container("kubelet-relay")


def containerfile_user() -> str:
    """The USER of the Containerfile's last stage (`UID:GID`)."""
    lines = (CONTAINER / "Containerfile").read_text().splitlines()
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    return user


def rendered(*components: str, root: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` makes of deploy/kubernetes with `components` (names
    under deploy/kubernetes/components), through a kustomization of its own in `root`;
    skips where kubectl is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: kustomize cannot render the components")
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes only relative paths
        "resources": [os.path.relpath(KUBERNETES, root)],
        "components": [
            os.path.relpath(KUBERNETES / "components" / name, root) for name in components
        ],
    }
    (root / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    result = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [body for body in yaml.safe_load_all(result.stdout) if body]


def admits(
    policy: dict[str, Any],
    namespace_labels: Mapping[str, str],
    pod_labels: Mapping[str, str],
    port: int | str,
) -> bool:
    """Whether an Ingress NetworkPolicy's rules admit a pod with `pod_labels`, in a namespace
    with `namespace_labels`, to `port`, as Kubernetes reads `matchLabels` selectors: every
    label given must match, a peer's namespace and pod selectors both; a peer without a
    namespace selector is of the policy's own namespace (the kustomization's); a rule
    without `from`, or a peer by address (`ipBlock`), admits anyone."""
    own = {"kubernetes.io/metadata.name": kustomization()["namespace"]}
    for rule in policy["spec"].get("ingress", []):
        ports = [entry["port"] for entry in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        if not rule.get("from"):
            return True
        for peer in rule["from"]:
            if "ipBlock" in peer:
                return True
            namespaces = peer.get("namespaceSelector", {"matchLabels": own})
            pods = peer.get("podSelector", {})
            if _selects(namespaces, namespace_labels) and _selects(pods, pod_labels):
                return True
    return False


def _selects(selector: dict[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels is read here"
    return bool(selector.get("matchLabels", {}).items() <= labels.items())
