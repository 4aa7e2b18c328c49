"""`gpuwatch tui`: the GPUs, processes, leases and waiting jobs of one or several machines."""
