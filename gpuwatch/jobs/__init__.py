"""Who holds each GPU on this node, as the cluster says: Slurm's jobs, or the pods the
kubelet gave GPUs to.

An engine (`engines.JobEngine`) answers a `JobTable` (jobs, and the job on each device, by
device-file minor number or UUID) or `None`, "jobs unknown", when the scheduler is absent,
down or slower than its deadline; nothing above this package needs to know which engine
answered. Each module is imported where it is used: a command the daemon answers, or a node
without a scheduler, loads no engine (`engines.ENGINE_CLASSES`).
"""
