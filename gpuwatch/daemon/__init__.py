"""`gpuwatch daemon`: one poller per machine, serving local clients and Prometheus.

- `service`: the daemon's life (start, SIGHUP reload, SIGTERM stop, systemd notify);
- `api`: the read-only HTTP API: its routes, and when a snapshot is current;
- `view`: what one request answers from (snapshot, staleness, leases, training reports);
- `listeners`: the Unix socket and TCP servers, under each request's deadline;
- `connection_pool`: their connection slots, shared fairly among clients;
- `webconfig`, `basic_auth`: Prometheus's web config for the TCP listener (TLS, passwords
  that cost the guesser, not the daemon; a reload never weakens it);
- `node`: the node's name (`--node-name`) on every snapshot the daemon takes;
- `wire`: HTTP/1.1 framing under a deadline, every error in JSON;
- `metrics`: the Prometheus exposition;
- `settings`: flags and the config file;
- `notify`: sd_notify.

Nothing here imports textual or torch.
"""
