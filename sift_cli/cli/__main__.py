"""`python -m sift_cli.cli …`: the `sift` command (what `sift profile --gpus N` starts its workers with)."""

from . import main

main()
