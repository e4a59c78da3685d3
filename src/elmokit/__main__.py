"""``python -m elmokit …`` (and ``torchrun -m elmokit …``): the ``elmokit`` command."""

import sys

from elmokit.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
