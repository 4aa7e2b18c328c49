"""What deploy/kubernetes promises an operator who applies it as it is: no runtime class or
priority to create first (each a documented choice, as a component), only Prometheus on
the daemon's port, a uid no host user has, probes that hold with TLS and passwords on, and
the kubelet's pod-resources socket, mounted read-only, reached through a relay that works."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.jobs.kubelet_places import DEFAULT_SOCKET
from gpuwatch.jobs.kubernetes import KubeletPods
from tests.helpers.certs import make_certs
from tests.helpers.daemon_net import client_tls, tcp_daemon
from tests.helpers.kubelet import gpu_pod, kubelet_stand_in
from tests.helpers.manifests import (
    CONTAINER,
    admits,
    containerfile_user,
    daemon_container,
    one,
    pod_spec,
    relay_container,
    rendered,
)
from tests.helpers.wait import wait_until
from tests.helpers.web_config import PASSWORD, web_config

# The labels the Prometheus Operator gives a Prometheus's pods, in kube-prometheus's namespace.
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}
PROMETHEUS = {
    "app.kubernetes.io/name": "prometheus",
    "app.kubernetes.io/managed-by": "prometheus-operator",
    "prometheus": "k8s",
}


def option(args: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}=")]
    return value


def daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [body for body in objects if body["kind"] == "DaemonSet"]
    return found


# runtime class


def test_no_runtime_class_is_needed_to_apply_the_manifests() -> None:
    assert "runtimeClassName" not in pod_spec()


def test_the_nvidia_runtime_class_is_a_component_to_add(tmp_path: Path) -> None:
    # WHEN the kustomization is rendered with the runtime-class component
    objects = rendered("nvidia-runtime-class", root=tmp_path)
    # THEN the DaemonSet's pods run under the toolkit's RuntimeClass, nothing else changed
    spec = daemonset(objects)["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert {**spec, "runtimeClassName": None} == {
        **daemonset(rendered(root=tmp_path))["spec"]["template"]["spec"],
        "runtimeClassName": None,
    }


# priority


def test_the_daemons_priority_is_its_own_class_which_evicts_nobody() -> None:
    # GIVEN the PriorityClass shipped, and the one the DaemonSet names
    priority = one("PriorityClass")
    assert pod_spec()["priorityClassName"] == priority["metadata"]["name"]
    # THEN it never preempts a workload to get a place, is nobody's default, and stays
    # below the values Kubernetes keeps for its system classes
    assert priority["preemptionPolicy"] == "Never"
    assert priority["globalDefault"] is False
    assert 0 < priority["value"] <= 1_000_000_000


def test_the_node_agents_priority_is_a_component_to_add(tmp_path: Path) -> None:
    spec = daemonset(rendered("system-node-critical", root=tmp_path))["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"


def test_both_components_render_together(tmp_path: Path) -> None:
    spec = daemonset(rendered("nvidia-runtime-class", "system-node-critical", root=tmp_path))
    inner = spec["spec"]["template"]["spec"]
    assert (inner["runtimeClassName"], inner["priorityClassName"]) == (
        "nvidia",
        "system-node-critical",
    )


# network policy


def test_the_network_policy_covers_the_daemons_pods_and_only_their_ingress() -> None:
    policy = one("NetworkPolicy")
    labels = one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize(
    ("namespace", "pod", "port", "admitted"),
    [
        (MONITORING, PROMETHEUS, "metrics", True),
        (MONITORING, PROMETHEUS, 22, False),
        (MONITORING, {"app.kubernetes.io/name": "grafana"}, "metrics", False),
        ({"kubernetes.io/metadata.name": "team-a"}, PROMETHEUS, "metrics", False),
        ({"kubernetes.io/metadata.name": "gpuwatch"}, {}, "metrics", False),
    ],
    ids=[
        "prometheus",
        "prometheus-other-port",
        "grafana-beside-it",
        "lookalike-in-a-users-namespace",
        "gpuwatchs-own-namespace",
    ],
)
def test_only_the_scraping_prometheus_reaches_the_metrics_port(
    namespace: dict[str, str], pod: dict[str, str], port: int | str, admitted: bool
) -> None:
    assert admits(one("NetworkPolicy"), namespace, pod, port) is admitted


def test_the_policy_names_the_port_the_daemon_listens_on() -> None:
    (port,) = daemon_container()["ports"]
    ports = [p["port"] for rule in one("NetworkPolicy")["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [port["name"]]


def test_the_pods_labels_reach_prometheus_as_the_daemon_exports_them() -> None:
    # GIVEN the ServiceMonitor, whose targets get namespace, pod and container labels of
    # their own (the daemon's pod): the pod info's labels would be renamed exported_pod ...
    (endpoint,) = one("ServiceMonitor")["spec"]["endpoints"]
    # THEN it keeps the daemon's own labels
    assert endpoint["honorLabels"] is True


# the daemon's uid


def test_the_daemon_runs_as_a_uid_no_host_gives_out() -> None:
    # GIVEN the daemon's uid and gid
    context = daemon_container()["securityContext"]
    uid, gid = context["runAsUser"], context["runAsGroup"]
    # THEN they are in Debian's reserved 65000-65533 and past systemd's dynamic users (61184-
    # 65519): neither useradd (up to 60000) nor systemd, nor subordinate ids (100000 on),
    # gives it to anyone; and nobody (65534) is not it
    assert uid == gid and 65520 <= uid <= 65533
    # AND the run directory is given to that uid and gid, the image runs as them
    (init,) = pod_spec()["initContainers"]
    assert f"chown {uid}:{gid} /run/gpuwatch" in init["command"][-1]
    assert containerfile_user() == f"{uid}:{gid}"
    build = (CONTAINER / "build.sh").read_text()
    assert f"--user {uid}:{gid}" in build and f"useradd --uid {uid} --gid {gid}" in build


# the kubelet's socket and its relay


def volume(name: str) -> dict[str, Any]:
    (found,) = [v for v in pod_spec()["volumes"] if v["name"] == name]
    return found


def relay_argv() -> tuple[str, str, str]:
    program, listen, connect = relay_container()["command"]
    return program, listen, connect


def test_the_kubelets_socket_is_mounted_read_only_into_the_relay_alone() -> None:
    # GIVEN the host folder of the kubelet's pod-resources socket
    kubelet_dir = os.path.dirname(DEFAULT_SOCKET)
    (mount,) = [
        m
        for c in (relay_container(), daemon_container())
        for m in c["volumeMounts"]
        if volume(m["name"]).get("hostPath", {}).get("path") == kubelet_dir
    ]
    # THEN only the relay mounts it, read-only, where it connects to
    assert mount in relay_container()["volumeMounts"] and mount["readOnly"] is True
    _, _, connect = relay_argv()
    assert connect == f"UNIX-CONNECT:{mount['mountPath']}/{os.path.basename(DEFAULT_SOCKET)}"


def test_the_daemon_reads_the_pods_where_the_relay_listens() -> None:
    _, listen, _ = relay_argv()
    listened = listen.split(":", 1)[1].split(",")[0]
    args = daemon_container()["args"]
    assert option(args, "jobs") == "kubernetes"
    assert option(args, "pod-resources-socket") == listened
    # AND both mount the folder it is in, which is the pod's own
    folder = os.path.dirname(listened)
    mounts = [
        {m["mountPath"]: m["name"] for m in c["volumeMounts"]}[folder]
        for c in (relay_container(), daemon_container())
    ]
    assert len(set(mounts)) == 1 and "emptyDir" in volume(mounts[0])
    # AND only the daemon's group may connect to it
    assert "mode=0660" in listen
    groups = {c["securityContext"]["runAsGroup"] for c in (relay_container(), daemon_container())}
    assert len(groups) == 1


def test_pods_read_through_the_relay_as_deployed(tmp_path: Path) -> None:
    """The relay's own command line, run here (its paths moved under tmp_path) between a
    kubelet stand-in and the daemon's reader."""
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (apt-get install socat): the relay cannot run")
    program, listen, connect = relay_argv()
    relay_socket = str(tmp_path / "relay.sock")
    with kubelet_stand_in(gpu_pod("ml", "train-0", "main", "GPU-1")) as kubelet:
        argv = [
            program,
            re.sub(r"UNIX-LISTEN:[^,]+", f"UNIX-LISTEN:{relay_socket}", listen),
            f"UNIX-CONNECT:{kubelet.socket_path}",
        ]
        assert connect.startswith("UNIX-CONNECT:")
        with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as relay:
            try:
                wait_until(lambda: os.path.exists(relay_socket), "the relay to listen")
                engine = KubeletPods(relay_socket)
                pending = engine.start()
                assert pending is not None
                pending.join(10)
                table = engine.latest()
            finally:
                relay.terminate()
    assert table is not None, engine.unknown_why()
    assert [job.job_id for job in table.jobs] == ["ml/train-0"]
    assert os.stat(tmp_path).st_mode  # the relay's socket was in the folder it was given


# probes


def liveness_argv(socket_path: Path) -> list[str]:
    """The liveness probe's command, with this Python and the test daemon's socket."""
    program, *args = daemon_container()["livenessProbe"]["exec"]["command"]
    assert program == "/opt/gpuwatch/bin/python"  # the image's
    script = args[-1].replace("/run/gpuwatch/gpuwatch.sock", str(socket_path))
    return [sys.executable, *args[:-1], script]


def test_the_probes_hold_with_tls_and_passwords_on(tmp_path: Path) -> None:
    # GIVEN a daemon whose TCP port wants HTTPS and a password (its --web-config)
    certs = make_certs(tmp_path)
    tls = "  cert_file: server.crt\n  key_file: server.key\n"
    (tmp_path / "web.yml").write_text(web_config(tls, {"prometheus": PASSWORD}))
    (tmp_path / "daemon").mkdir()
    with tcp_daemon(tmp_path / "daemon", "--web-config", str(tmp_path / "web.yml")) as daemon:
        # (the port does want both)
        assert daemon.get("/metrics", tls=client_tls(certs.ca)).status == 401
        # WHEN the kubelet probes it as the DaemonSet says
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5):
            pass  # readiness: the port accepts
        live = subprocess.run(
            liveness_argv(daemon.socket_path), capture_output=True, timeout=30, check=False
        )
        # THEN both pass
        assert live.returncode == 0, live.stderr
    # AND once the daemon is gone, liveness fails
    gone = subprocess.run(
        liveness_argv(daemon.socket_path), capture_output=True, timeout=30, check=False
    )
    assert gone.returncode != 0
