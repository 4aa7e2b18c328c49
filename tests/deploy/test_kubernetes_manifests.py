"""What a cluster relies on from deploy/kubernetes: the node's name, the host's socket and
lease directory, least privilege, a scrape path from Service to ServiceMonitor, and alerts on
metrics the daemon really exports."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest

from gpuwatch._version import __version__
from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.daemon_command import daemon
from gpuwatch.daemon.job_watch import JobsNow
from gpuwatch.daemon.metrics import exposition
from gpuwatch.daemon.view import View
from gpuwatch.jobs.job_table import Job, JobTable
from gpuwatch.paths import SYSTEM_DIR, SYSTEM_LEASE_DIR, SYSTEM_SOCKET
from gpuwatch.sampling.poller import PollState
from tests.helpers.manifests import (
    daemon_container,
    kustomization,
    one,
    pod_spec,
    relay_container,
)

# Labels Prometheus and its Operator put on every target of a ServiceMonitor.
TARGET_LABELS = {"job", "instance", "namespace", "service", "pod", "container", "endpoint"}


def exported_series() -> dict[str, set[str]]:
    """Each family the daemon exports for a simulated node where a job holds GPU 0, with its
    labels."""
    from prometheus_client.parser import text_string_to_metric_families

    snapshot = SimBackend(4, clock=lambda: 1_790_000_000.0).sample()
    held = JobTable(
        (Job("4242", "alice", None, (snapshot.gpus[0].minor_number or 0,), None, None),), 0.0
    )
    jobs = JobsNow(held, None, 600.0, {str(snapshot.gpus[0].uuid): 0.0})
    text = exposition(View(PollState(snapshot, None, 0.0, 1), jobs=jobs)).decode()
    families = text_string_to_metric_families(text)
    return {f.name: {label for s in f.samples for label in s.labels} for f in families}


def option(args: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}=")]
    return value


def test_the_daemon_is_named_after_its_node() -> None:
    # GIVEN the daemon's environment
    env = {item["name"]: item for item in daemon_container()["env"]}
    # THEN it names the node the pod runs on (the downward API), not the pod
    assert env["GPUWATCH_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_the_daemon_serves_the_socket_where_the_nodes_clients_look() -> None:
    # GIVEN the host's /run/gpuwatch mounted into the daemon's container
    volumes = {volume["name"]: volume for volume in pod_spec()["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in daemon_container()["volumeMounts"]}
    assert volumes[mounts[SYSTEM_DIR]]["hostPath"]["path"] == SYSTEM_DIR
    # THEN its socket is at the path status and pick try first on the host
    assert option(daemon_container()["args"], "socket") == SYSTEM_SOCKET


def test_the_daemons_arguments_are_options_it_takes() -> None:
    # WHEN `gpuwatch daemon` parses the DaemonSet's arguments THEN none is refused
    daemon.make_context("daemon", list(daemon_container()["args"]))


def test_a_misspelt_argument_is_refused() -> None:
    with pytest.raises(click.UsageError):
        daemon.make_context("daemon", ["--listenn=0.0.0.0:19400"])


@pytest.mark.skipif(os.geteuid() != 0, reason="the run-dir step chowns: needs root")
def test_the_run_dir_step_gives_the_socket_dir_to_the_daemon_and_leases_to_all(
    tmp_path: Path,
) -> None:
    # GIVEN a host directory root made, as the kubelet makes a missing hostPath
    run_dir = tmp_path / "gpuwatch"
    run_dir.mkdir(mode=0o700)
    (init,) = pod_spec()["initContainers"]
    script = init["command"][-1].replace(SYSTEM_DIR, str(run_dir))
    # WHEN the init container's script runs, twice (a pod restarted on the same node)
    for _ in range(2):
        subprocess.run(["/bin/sh", "-ec", script], check=True)
    # THEN the directory is the daemon's alone, and the lease directory everyone's, sticky
    uid = daemon_container()["securityContext"]["runAsUser"]
    # (the lease directory being the one pick and select() use on the host)
    info, leases = run_dir.stat(), (run_dir / os.path.relpath(SYSTEM_LEASE_DIR, SYSTEM_DIR)).stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uid, 0o755)
    assert (leases.st_uid, stat.S_IMODE(leases.st_mode)) == (0, 0o1777)


def every_container() -> list[dict[str, Any]]:
    return pod_spec()["initContainers"] + pod_spec()["containers"]


@pytest.mark.parametrize("container", every_container(), ids=lambda c: c["name"])
def test_no_container_can_gain_privileges_or_write_its_image(container: dict[str, Any]) -> None:
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert not context.get("privileged")
    assert container["resources"]["limits"]["memory"]


def test_the_daemon_runs_as_a_user_with_no_capabilities_and_the_default_seccomp() -> None:
    context = daemon_container()["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
    assert "add" not in context["capabilities"]
    spec = pod_spec()
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    assert not spec.get("hostNetwork")


def test_only_the_run_dir_step_and_the_kubelet_relay_are_root() -> None:
    # GIVEN every container of the pod
    root = {c["name"] for c in every_container() if c["securityContext"].get("runAsUser") == 0}
    # THEN only the step that owns the run directory, which may only chown, and the relay to
    # the kubelet's root-only socket, which may do nothing root's capabilities allow, are root
    assert root == {"run-dir", "kubelet-relay"}
    (init,) = pod_spec()["initContainers"]
    assert init["securityContext"]["capabilities"]["add"] == ["CHOWN"]
    assert "add" not in relay_container()["securityContext"]["capabilities"]
    assert "ports" not in relay_container()


def test_the_service_reaches_the_daemons_metrics_port() -> None:
    # GIVEN the Service and the pods of the DaemonSet
    service, template = one("Service"), one("DaemonSet")["spec"]["template"]
    (port,) = service["spec"]["ports"]
    (container_port,) = daemon_container()["ports"]
    # THEN it selects those pods, on the port the daemon listens on
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert port["targetPort"] == container_port["name"]
    listen = option(daemon_container()["args"], "listen")
    assert int(listen.rsplit(":", 1)[1]) == container_port["containerPort"]
    assert daemon_container()["readinessProbe"]["tcpSocket"]["port"] == container_port["name"]


def test_the_service_monitor_scrapes_the_service() -> None:
    monitor, service = one("ServiceMonitor"), one("Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {
        p["name"] for p in service["spec"]["ports"]
    }


def rules() -> list[dict[str, Any]]:
    return [rule for group in one("PrometheusRule")["spec"]["groups"] for rule in group["rules"]]


def gpuwatch_names(expr: str) -> set[str]:
    """gpuwatch's series in an expression; not the recorded names that embed them."""
    return set(re.findall(r"(?<![\w:])gpuwatch_\w+(?![\w:])", expr))


def test_rules_use_only_metrics_the_daemon_exports() -> None:
    # GIVEN what the daemon exports for a simulated node
    exported = set(exported_series())
    # THEN every gpuwatch series the rules read is one of them
    used = {name for rule in rules() for name in gpuwatch_names(rule["expr"])}
    assert {"gpuwatch_gpu_up", "gpuwatch_sampling_up"} <= used
    assert used <= exported, sorted(used - exported)


def test_rules_read_recordings_only_where_a_rule_records_them() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    used = {name for rule in rules() for name in re.findall(r"\w+:\w+:\w+", rule["expr"])}
    assert used <= recorded


def test_alert_texts_name_only_labels_their_series_carry() -> None:
    # GIVEN the labels of each series, and those the ServiceMonitor adds to every target
    series = exported_series()
    relabelled = {
        relabel["targetLabel"]
        for endpoint in one("ServiceMonitor")["spec"]["endpoints"]
        for relabel in endpoint.get("relabelings", [])
    }
    for rule in (rule for rule in rules() if "alert" in rule):
        carried = TARGET_LABELS | relabelled
        carried |= {label for name in gpuwatch_names(rule["expr"]) for label in series[name]}
        texts = " ".join(rule.get("annotations", {}).values())
        # THEN each label an alert's text names is there to name
        assert set(re.findall(r"\$labels\.(\w+)", texts)) <= carried, rule["alert"]


def test_the_daemon_down_alert_watches_the_service_monitors_job() -> None:
    monitor, service = one("ServiceMonitor"), one("Service")
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    (down,) = [rule for rule in rules() if rule.get("alert") == "GpuwatchDown"]
    assert down["expr"].startswith(f'up{{job="{job}"}} == 0')


def test_the_kustomization_deploys_the_image_build_sh_tags() -> None:
    # GIVEN the image the DaemonSet names, as the kustomization sets it
    (image,) = kustomization()["images"]
    assert {c["image"] for c in every_container()} == {image["name"]}
    build = (Path(__file__).parents[2] / "deploy" / "container" / "build.sh").read_text()
    default_tag = re.search(r'tag="\$\{1:-([^}]+)\}"', build)
    assert default_tag is not None
    # THEN it is the image of this version that build.sh makes
    expected = default_tag.group(1).replace("$version", __version__)
    assert f"{image['newName']}:{image['newTag']}" == expected
