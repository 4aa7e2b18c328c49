"""`gpuwatch daemon`: one poller per machine, serving local clients and Prometheus.

- `service`: the daemon's life (start, SIGHUP reload, SIGTERM stop, systemd notify);
- `api`: the read-only HTTP API on the Unix socket;
- `metrics`: the Prometheus exposition;
- `settings`: flags and the config file;
- `notify`: sd_notify.

Nothing here imports textual or torch.
"""
