"""``python -m rlsched`` is the ``rlsched`` command."""

from rlsched.cli import main

main()
