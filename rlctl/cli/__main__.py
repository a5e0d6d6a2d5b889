"""`python -m rlctl.cli ...`: the same as the `rlctl` command (for scripts that pick the interpreter)."""

from rlctl.cli import main

main()
