"""``python -m elmokit.cli …``: the same as ``python -m elmokit …`` (kept for scripts written against it)."""

import sys

from elmokit.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
