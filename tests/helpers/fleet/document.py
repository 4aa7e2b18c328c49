"""The keys `gpuwatch fleet --json` promises for each node and each GPU."""

from __future__ import annotations

NODE_KEYS = {
    "node",
    "label",
    "target",
    "job",
    "claims",
    "mig_devices_known",
    "up",
    "age_s",
    "error",
    "exporter",
    "simulated",
    "lease_waiters",
    "longest_wait_s",
    "jobs_known",
    "gpus",
}


GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "memory_total_bytes",
    "memory_free_bytes",
    "memory_used_bytes",
    "utilization_pct",
    "temperature_c",
    "power_w",
    "leases_exclusive",
    "leases_shared",
    "mig_enabled",
    "job_id",
    "job_user",
    "allocated_idle_s",
    "pods",
    "processes",
    "mig_devices",
}
MIG_KEYS = {
    "index",
    "uuid",
    "profile",
    "gpu_instance_id",
    "compute_instance_id",
    "memory_total_bytes",
    "memory_used_bytes",
    "memory_free_bytes",
    "pods",
}
PROCESS_KEYS = {"pid", "user", "command", "memory_used_bytes", "kind", "mig_uuid"}
