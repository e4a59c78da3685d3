"""One native build per environment, measured: two environments on one machine importing elmokit in turn.

Each "environment" is a child process whose ``sys.prefix`` is set to its own path before elmokit is imported (what
separates two virtual environments with the same torch in :func:`elmokit.modules.native.build_name`), all sharing one
fresh, temporary ``TORCH_EXTENSIONS_DIR``. The children run A, B, A, B, A, B, then two children of a third environment
C start at the same moment. Each prints :func:`elmokit.modules.native.status` and its seconds from start to kernels
loaded; the last line is one JSON object: the builds per environment (expected: 1 each, and 1 for the two C children
together) and the seconds of each child.

Run: ``python bench/native_build.py`` (two to four real builds: minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, time
start = time.perf_counter()
sys.prefix = sys.argv[1]
from elmokit.modules import native
native.kernels()
print(json.dumps(dict(native.status(), prefix=sys.argv[1], seconds=time.perf_counter() - start)))
"""


def start(prefix: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, prefix], env=env, stdout=subprocess.PIPE, text=True)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="elmokit-native-bench-") as tmp:
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=tmp, PYTHONPATH=str(ROOT / "src"))
        env.pop("ELMOKIT_NATIVE", None)
        runs = []
        for prefix in ["/envs/a", "/envs/b"] * 3:
            out, _ = start(prefix, env).communicate()
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
        together = [start("/envs/c", env), start("/envs/c", env)]
        for p in together:
            out, _ = p.communicate()
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    builds = {}
    for r in runs:
        builds[r["prefix"]] = builds.get(r["prefix"], 0) + (r["state"] == "built now")
    print(json.dumps({"builds": builds, "seconds": [(r["prefix"], r["state"], round(r["seconds"], 2)) for r in runs]}))


if __name__ == "__main__":
    main()
