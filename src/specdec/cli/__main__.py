"""``python -m specdec.cli``: the console script."""

from specdec.cli import entry

entry()
