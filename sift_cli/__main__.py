"""`python -m sift_cli …` runs the `sift` command (for trees run from source, without the console script)."""

from .cli import main

main()
