"""Threads on a busy machine: how long OpenMP threads spin while they wait, and elmokit's default thread count.

torch runs its intra-op parallel work (and MKL's and oneDNN's) on GNU OpenMP (libgomp). A thread that reaches the
end of a parallel region first waits for the others; by default libgomp makes it *spin* for 300,000 iterations (about
10 ms on this project's CPUs) before it sleeps. elmokit's recurrent loops open thousands of small parallel regions per
training step. On a quiet machine the spinning costs nothing; when another process holds a core, the thread we wait
for is not running, and the spinning one burns its own time slice waiting for it, region after region: a 2-thread
training step of the quickstart ran about 10× slower beside another 2-thread job (see
docs/how-to/threads.md and ``bench/contention.py``).

:func:`configure_openmp` (run when ``elmokit`` is imported, before it imports torch) therefore sets
``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` — short enough that a waiting thread soon yields its core, long enough to
cover the gaps between regions of a quiet step — unless the user has set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
(their choice wins). libgomp reads these variables once, when torch loads it: in a program that imports torch before
elmokit the call changes nothing (:func:`openmp_settings` says so), and the variables must be set in the environment
before Python starts, e.g. ``GOMP_SPINCOUNT=1000 python my_script.py``.

The numbers: a thread count and a spin count change the order of floating-point reductions only through the thread
count (the spin count changes who waits, not what is computed), so results are bit-identical for a given thread
count, as before.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from elmokit.errors import UsageError

__all__ = [
    "SPIN_COUNT",
    "configure_openmp",
    "openmp_settings",
    "available_cpus",
    "default_threads",
    "set_threads",
    "using_threads",
    "CpuShare",
    "cpu_share",
]

#: ``GOMP_SPINCOUNT`` elmokit sets when the user set neither it nor ``OMP_WAIT_POLICY`` (libgomp's own default is
#: 300,000). Chosen with ``bench/contention.py`` (docs/how-to/threads.md).
SPIN_COUNT = 1000

_OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_set_by_elmokit: dict[str, str] = {}
_torch_loaded_first: bool | None = None


def configure_openmp() -> None:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` in ``os.environ`` if the user set neither ``OMP_WAIT_POLICY``
    nor ``GOMP_SPINCOUNT`` and torch is not loaded yet (libgomp reads them once, when torch loads it). Child
    processes inherit the setting. Called by ``import elmokit``; calling it again does nothing more.

    Source: libgomp's documented environment variables (GCC manual, "GOMP_SPINCOUNT", "OMP_WAIT_POLICY").
    """
    global _torch_loaded_first
    if _torch_loaded_first is not None:
        return
    _torch_loaded_first = "torch" in sys.modules
    if _torch_loaded_first or any(os.environ.get(v) for v in _OPENMP_VARIABLES):
        return
    os.environ["GOMP_SPINCOUNT"] = _set_by_elmokit["GOMP_SPINCOUNT"] = str(SPIN_COUNT)


def openmp_settings() -> dict:
    """What governs OpenMP's waiting in this process: ``{"OMP_WAIT_POLICY": str | None, "GOMP_SPINCOUNT": str |
    None, "set_by_elmokit": {name: value}, "torch_loaded_first": bool | None}`` (``torch_loaded_first`` True: torch
    was imported before elmokit, so elmokit set nothing and libgomp runs with what the environment held then)."""
    return {
        **{v: os.environ.get(v) for v in _OPENMP_VARIABLES},
        "set_by_elmokit": dict(_set_by_elmokit),
        "torch_loaded_first": _torch_loaded_first,
    }


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by a cgroup CPU quota (a container's ``--cpus``), or ``None`` without one. Reads cgroup v2's
    ``cpu.max`` (``"quota period"`` or ``"max period"``), else v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """The CPUs this process may use: those in its affinity mask (``os.sched_getaffinity``; ``taskset``, a batch
    system's binding), capped by a cgroup CPU quota rounded up (a container's ``--cpus 1.5`` gives 2), at least 1.
    The machine's CPU count where neither is known."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)


def default_threads() -> int:
    """The torch thread count every ``elmokit`` command uses unless given ``--threads``: ``ELMOKIT_THREADS`` when
    set, else ``OMP_NUM_THREADS`` (what torch itself would use; its first entry), else :func:`available_cpus`.

    Raises:
        UsageError: ``ELMOKIT_THREADS`` is not an integer >= 1 (the message names the variable and its value).
    """
    text = os.environ.get("ELMOKIT_THREADS")
    if text is None or not text.strip():
        omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # OpenMP's list form: the first level
        return int(omp) if omp.isdigit() and int(omp) >= 1 else available_cpus()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"ELMOKIT_THREADS must be an integer >= 1, got {text!r}")
    return value


def set_threads(n: int) -> None:
    """Use ``n`` torch intra-op threads from now on (``torch.set_num_threads``).

    Raises:
        UsageError: ``n`` is not an int >= 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"the thread count must be an int >= 1, got {n!r}")
    import torch  # lazy: this module is imported before torch, so that configure_openmp comes first

    torch.set_num_threads(n)


@contextlib.contextmanager
def using_threads(n: int) -> Iterator[None]:
    """Run the block on ``n`` torch intra-op threads and restore the previous count afterwards (the CLI's ``main``
    runs each command so, since tests and scripts call it in-process).

    Raises:
        UsageError: ``n`` is not an int >= 1.
    """
    import torch  # lazy: see set_threads

    previous = torch.get_num_threads()
    set_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass
class CpuShare:
    """How much of its threads' CPU time a block of code got: ``share`` = process CPU seconds / (wall seconds ×
    threads), about 0.9–1.0 for torch work on a quiet machine and about half or less where another process holds the
    cores. ``load_average``: the 1-minute load average at the end; ``cpus``: :func:`available_cpus`."""

    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    threads: int = 1
    load_average: float = 0.0
    cpus: int = 1

    @property
    def share(self) -> float:
        return self.cpu_seconds / max(self.wall_seconds * self.threads, 1e-9)


@contextlib.contextmanager
def cpu_share() -> Iterator[CpuShare]:
    """Measure the block's :class:`CpuShare` (filled in when the block ends)."""
    import torch  # lazy: see set_threads

    result = CpuShare(threads=torch.get_num_threads(), cpus=available_cpus())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, wall0 = usage.ru_utime + usage.ru_stime, time.perf_counter()
    yield result
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result.wall_seconds = time.perf_counter() - wall0
    result.cpu_seconds = usage.ru_utime + usage.ru_stime - cpu0
    with contextlib.suppress(OSError):
        result.load_average = os.getloadavg()[0]
