"""Reports a training process leaves behind: training progress, out-of-memory, memory snapshots."""
