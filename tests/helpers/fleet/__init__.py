"""Fleet harnesses: real Prometheus, simulated nodes and exporters, hostile endpoints."""
