"""`python -m xover`: the same entry point as the `xover` script."""

from xover.cli import main

main()
