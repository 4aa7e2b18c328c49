"""The shipped alerts, run by Prometheus's own rule tester (`promtool test rules`) on series
as the daemon exports them: examples/gpuwatch-alerts.yml and the Kubernetes PrometheusRule."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.manifests import one

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="needs promtool (apt-get install prometheus)"
)

# A node where job 4242 (alice) holds GPU 0, idle since the start, and GPU 1, busy; GPU 2 is
# idle and held by nobody. The daemon's idle window is 10 minutes. Series carry the scrape's
# `job` and `instance`, and `node` as the Kubernetes ServiceMonitor's relabelling adds it.
TARGET = 'hostname="n1",instance="10.0.0.7:19400",job="gpuwatch",node="n1"'
SERIES = [
    (f'gpuwatch_gpu_allocated_idle_seconds{{gpu="0",uuid="GPU-a",{TARGET}}}', "0+60x30"),
    (f'gpuwatch_gpu_allocated_idle_seconds{{gpu="1",uuid="GPU-b",{TARGET}}}', "0x30"),
    (
        f'gpuwatch_gpu_job_info{{gpu="0",uuid="GPU-a",job_id="4242",job_user="alice",{TARGET}}}',
        "1x30",
    ),
    (
        f'gpuwatch_gpu_job_info{{gpu="1",uuid="GPU-b",job_id="4242",job_user="alice",{TARGET}}}',
        "1x30",
    ),
    (f'gpuwatch_utilization_ratio{{gpu="2",uuid="GPU-c",{TARGET}}}', "0x30"),
    (f"gpuwatch_jobs_idle_window_seconds{{{TARGET}}}", "600x30"),
]
FIRING = {
    "severity": None,  # each file's own
    "gpu": "0",
    "uuid": "GPU-a",
    "hostname": "n1",
    "instance": "10.0.0.7:19400",
    "job": "gpuwatch",
    "node": "n1",
    "job_id": "4242",
    "job_user": "alice",
}


def idle_alert_test(
    rule_file: Path,
    alertname: str,
    series: list[tuple[str, str]],
    labels: dict[str, str | None],
    annotations: dict[str, str],
) -> dict[str, object]:
    """promtool's test of `alertname`: quiet at 9 minutes of `series`, firing with `labels`
    and `annotations` at 12."""
    firing = {"exp_labels": labels, "exp_annotations": annotations}
    return {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": alertname, "exp_alerts": []},
                    {"eval_time": "12m", "alertname": alertname, "exp_alerts": [firing]},
                ],
            }
        ],
    }


def run_promtool(tmp_path: Path, test: dict[str, object]) -> None:
    tests = tmp_path / "tests.yml"
    tests.write_text(yaml.safe_dump(test))
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(tests)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def promtool_test(tmp_path: Path, rule_file: Path, severity: str, summary: str) -> None:
    description = (
        "Ask the job's owner to release it (scancel 4242), or see `gpuwatch status` on n1."
    )
    annotations = {"summary": summary, "description": description}
    labels = {**FIRING, "severity": severity}
    run_promtool(
        tmp_path, idle_alert_test(rule_file, "GpuAllocatedIdle", SERIES, labels, annotations)
    )


def test_an_allocated_gpu_idle_past_the_window_alerts_with_its_job_and_user(
    tmp_path: Path,
) -> None:
    # GIVEN GPU 0 held by job 4242 and idle from the start; GPU 1 held but busy; GPU 2 idle, free
    # THEN no alert before 10 minutes, and after them one: GPU 0's, naming the job and its user
    summary = "GPU 0 on n1, held by job 4242 of alice, has computed nothing for 12m 0s"
    promtool_test(tmp_path, EXAMPLES / "gpuwatch-alerts.yml", "warn", summary)


def test_the_kubernetes_rule_alerts_alike(tmp_path: Path) -> None:
    rules = tmp_path / "prometheusrule.yml"
    rules.write_text(yaml.safe_dump({"groups": one("PrometheusRule")["spec"]["groups"]}))
    summary = "GPU 0 on node n1, held by job 4242 of alice, has computed nothing for 12m 0s"
    promtool_test(tmp_path, rules, "warning", summary)


def test_a_gpu_a_pod_holds_idle_past_the_window_alerts_with_the_pod(tmp_path: Path) -> None:
    # GIVEN GPU 0 held by pod ml/train-0 and idle from the start (its labels kept as the
    # daemon exports them: the ServiceMonitor honours them); GPU 1 held by it but busy
    pod = 'namespace="ml",pod="train-0",container="trainer"'
    series = [
        (f'gpuwatch_gpu_allocated_idle_seconds{{gpu="0",uuid="GPU-a",{TARGET}}}', "0+60x30"),
        (f'gpuwatch_gpu_allocated_idle_seconds{{gpu="1",uuid="GPU-b",{TARGET}}}', "0x30"),
        (f'gpuwatch_gpu_pod_info{{gpu="0",uuid="GPU-a",{pod},{TARGET}}}', "1x30"),
        (f'gpuwatch_gpu_pod_info{{gpu="1",uuid="GPU-b",{pod},{TARGET}}}', "1x30"),
        (f"gpuwatch_jobs_idle_window_seconds{{{TARGET}}}", "600x30"),
    ]
    rules = tmp_path / "prometheusrule.yml"
    rules.write_text(yaml.safe_dump({"groups": one("PrometheusRule")["spec"]["groups"]}))
    expected = {
        **{k: v for k, v in FIRING.items() if k not in ("job_id", "job_user")},
        "severity": "warning",
        "namespace": "ml",
        "pod": "train-0",
        "container": "trainer",
    }
    annotations = {
        "summary": "GPU 0 on node n1, held by pod ml/train-0 (container trainer), has "
        "computed nothing for 12m 0s",
        "description": "kubectl -n ml describe pod train-0 says whose it is; "
        "`gpuwatch status` on n1 shows the GPU.",
    }
    run_promtool(tmp_path, idle_alert_test(rules, "GpuPodIdle", series, expected, annotations))
