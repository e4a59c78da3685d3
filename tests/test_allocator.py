"""elmokit.allocator: glibc malloc tuning is applied once, reported truthfully, and can be turned off."""

import subprocess
import sys

import pytest

SNIPPET = """
import ctypes, sys
from elmokit import allocator
first = allocator.keep_freed_memory()
second = allocator.keep_freed_memory()
print(first, second)
"""


def _run(env_extra):
    import os

    env = dict(os.environ)
    env.pop("ELMOKIT_MALLOC", None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, env=env, check=True).stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_keep_freed_memory_applies_once_on_glibc():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert _run({}).split() == ["True", "True"]


def test_keep_freed_memory_respects_opt_out():
    assert _run({"ELMOKIT_MALLOC": "system"}).split() == ["False", "False"]
