"""The recorded exporter pages of `tests/fleet/data/recorded/`, each served by a stand-in
exporter, for a real Prometheus to scrape as a fleet's would: plainly, and as Kubernetes'
ServiceMonitor does (the exporter pod's own `pod`, `namespace` and `container` on every
series it scrapes), with `honor_labels` and without; and two targets of the dcgm job that
are never up.

The same page in several jobs is one endpoint, so one instance in several jobs: a node
each (`job/instance`), as Prometheus has them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.fleet.endpoints import Endpoint, refusing, serving_recorded
from tests.helpers.fleet.prometheus import Prometheus, Target, running_prometheus

DCGM_PAGES = (
    "dcgm-exporter_kops_l4.prom",
    "dcgm-exporter_upcloud_l40s.prom",
    "dcgm-exporter_vks_grid-a100-40c.prom",
    "dcgm-exporter_vks_grid-a100-10c.prom",
    "dcgm-exporter_ericsson_t4_no-help.prom",
    "dcgm-exporter-4x_lke_rtx4000ada_pod.prom",
    "dcgm-exporter-2x_nvidia-docs_a100-mig.prom",
    "dcgm-exporter-4x_pr736_mixed-mig-pod_excerpt.prom",
    "dcgm-exporter_issue317_a30-mig_excerpt.prom",
    "dcgm-exporter_issue490_h100-pod_excerpt.prom",
    "dcgm-exporter_issue512_h100-mig-pods_excerpt.prom",
    "dcgm-exporter_aicr_eks-h100x8_sampled.prom",
)
SMI_PAGES = (
    "nvidia-gpu-exporter_h100_load.prom",
    "nvidia-gpu-exporter_h100-mig_idle.prom",
    "nvidia-gpu-exporter_h100-mig_load.prom",
    "nvidia-gpu-exporter_l40s_load.prom",
    "nvidia-gpu-exporter-0x_docs_rtx2080super.prom",
    "nvidia-gpu-exporter_windows_rtx2080super_idle.prom",
)
KUBERNETES_PAGES = ("dcgm-exporter-4x_lke_rtx4000ada_pod.prom", "dcgm-exporter_kops_l4.prom")
EXPORTER_POD: Mapping[str, str] = {
    "pod": "nvidia-dcgm-exporter-wqqqn",
    "namespace": "gpu-operator",
    "container": "nvidia-dcgm-exporter",
}
"""The labels a ServiceMonitor gives every series of a dcgm-exporter pod (NVIDIA/aicr's
EKS answers carry these)."""
JOBS = {
    "dcgm": (DCGM_PAGES, {}, False),
    "smi": (SMI_PAGES, {}, False),
    "dcgm-k8s": (KUBERNETES_PAGES, EXPORTER_POD, False),
    "dcgm-k8s-honor": (KUBERNETES_PAGES, EXPORTER_POD, True),
}
"""Each job: its pages, the labels of its targets, its `honor_labels`."""


@dataclass(frozen=True)
class RecordedFleet:
    prometheus: Prometheus
    pages: dict[str, Endpoint]
    never_up: tuple[Endpoint, ...]
    """Targets of the `dcgm` job where nothing listens."""

    def job_of(self, page: str) -> str:
        """The job that scrapes `page` plainly."""
        return "dcgm" if page in DCGM_PAGES else "smi"


@contextmanager
def recorded_fleet(home: Path) -> Iterator[RecordedFleet]:
    """Every recorded page served, and a Prometheus that has scraped each at least once."""
    with ExitStack() as stack:
        pages = {
            name: stack.enter_context(serving_recorded(name)) for name in (*DCGM_PAGES, *SMI_PAGES)
        }
        never_up = tuple(stack.enter_context(refusing()) for _ in range(2))
        targets = [
            Target(pages[page].address, job, labels=labels, honor_labels=honor)
            for job, (names, labels, honor) in JOBS.items()
            for page in names
        ]
        targets += [Target(endpoint.address, "dcgm") for endpoint in never_up]
        prometheus = stack.enter_context(running_prometheus(home, targets))
        prometheus.wait_until_up([endpoint.address for endpoint in pages.values()])
        # A page is one instance in several jobs: each job's target scraped, not only one.
        up = len(targets) - len(never_up)
        prometheus.wait_for("up == 1", lambda found: len(found) == up, f"{up} targets up")
        prometheus.wait_until_up([endpoint.address for endpoint in never_up], up=False)
        yield RecordedFleet(prometheus, pages, never_up)
