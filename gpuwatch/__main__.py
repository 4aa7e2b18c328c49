"""`python -m gpuwatch`: the `gpuwatch` command."""

from gpuwatch.cli import main

main()
