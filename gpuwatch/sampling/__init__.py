"""Sampling a backend at a steady interval (`poller`) into a bounded history (`history`)."""
