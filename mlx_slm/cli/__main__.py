"""`python -m mlx_slm.cli`: the `mlx-slm` command."""

from . import main

main()
