"""A MIG node as a scenario (an A100 in three MIG devices beside a whole one), and pick's argv."""

from __future__ import annotations

import sys

PICK = (sys.executable, "-m", "gpuwatch", "pick")


# GPU 0 in MIG mode: a busy 3g.40gb, a busy 2g.20gb, an idle 1g.10gb. GPU 1 whole, and busy.
NODE = """
hostname = "mig-node"
[[gpu]]
model = "A100-80GB"
mig = ["3g.40gb", "2g.20gb", "1g.10gb"]
[[gpu]]
model = "A100-80GB"
[[process]]
gpu = 0
mig = 0
pid = 71001
memory = "30GiB"
[[process]]
gpu = 0
mig = 1
pid = 72001
memory = "14GiB"
[[process]]
gpu = 1
pid = 73001
memory = "70GiB"
"""
