"""``python -m invariants.cli``: the `kvspec` command."""

from invariants.cli import main

main()
