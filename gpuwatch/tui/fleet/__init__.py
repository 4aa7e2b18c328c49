"""`gpuwatch fleet`: every node of a fleet, one row each, with the fleet's totals above."""
