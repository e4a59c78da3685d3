"""The worker processes of ``embed_file(workers=N)``: each takes part numbers from a queue, writes those parts with
its own copy of the embedder (``worker_threads`` torch threads), and reports progress, finished parts and errors on
another queue; the parent (:func:`run_workers`) gathers them, and names the cause when workers cannot start or die.

Workers are spawned (``multiprocessing``'s ``spawn``: each imports the caller's ``__main__`` again), start with
Ctrl-C/SIGTERM blocked until their handler is installed, ignore SIGINT (the parent stops them) and stop when the
parent is gone.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from elmokit import interrupts
from elmokit.errors import EmbedWorkerError, UsageError, option_wording

__all__ = ["UNGUARDED_EXIT", "spawn_bootstrapping", "run_workers"]

#: Exit status of a spawned worker that found ``embed_file`` called again while it imported the caller's script (a
#: script without an ``if __name__ == "__main__":`` guard): the parent names the missing guard.
UNGUARDED_EXIT = 87


def spawn_bootstrapping() -> bool:
    """Whether this process is a spawned child still importing its parent's ``__main__`` (``multiprocessing`` sets
    ``_inheriting`` while it does): code that runs then is the script's unguarded top level, run a second time."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _unguarded_script() -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return f"the script {main}" if main else "the calling script"


def _worker_main(embedder, writer: Any, threads: int, tasks, results, parent: int) -> None:
    """A worker process: take part numbers from ``tasks`` until ``None``, write each, report on ``results``."""
    torch.set_num_threads(threads)
    with interrupts.handling_signals():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us (SIGTERM)
        try:
            interrupts.unblock()  # started with the signals blocked (see run_workers): a pending SIGTERM lands here
            while os.getppid() == parent:  # an orphan (the parent was killed) stops
                try:
                    k = tasks.get(timeout=1.0)
                except queue.Empty:
                    continue
                if k is None:
                    return
                writer.write(
                    embedder, k, progress=lambda n: results.put(("n", n)), alive=lambda: os.getppid() == parent
                )
                results.put(("done", k))
        except KeyboardInterrupt:
            return
        except BaseException as exc:  # noqa: BLE001 — sent to the parent, which raises it
            try:
                payload = pickle.dumps(exc)
                pickle.loads(payload)
            except Exception:  # noqa: BLE001 — an exception that does not survive pickling
                payload = pickle.dumps(EmbedWorkerError(f"a worker failed: {type(exc).__name__}: {exc}"))
            results.put(("error", payload))


def _queues(ctx, todo: list[int], n: int):
    """The ``(tasks, results)`` queues; ``tasks`` holds the part numbers ``todo``, then one ``None`` per worker."""
    tasks, results = ctx.Queue(), ctx.Queue()
    tasks.cancel_join_thread()  # never wait at exit to feed part numbers nobody will read
    for k in todo:
        tasks.put(k)
    for _ in range(n):
        tasks.put(None)
    return tasks, results


def _check_workers(procs: list, results, remaining: set[int], workers: int, writer: Any) -> None:
    """Raise when a worker stopped before the work was done (called while waiting for ``results``): the missing
    ``__main__`` guard, a worker's own error still in the queue, or the dead workers' exit statuses."""
    dead = [p for p in procs if p.exitcode not in (None, 0)]
    if any(p.exitcode == UNGUARDED_EXIT for p in dead):
        raise UsageError(
            f"the worker processes could not start: {_unguarded_script()} calls embed_file(workers="
            f"{workers}) at its top level; each spawned worker imports that script again, so "
            'put the call under `if __name__ == "__main__":`'
        ) from None
    if dead or all(p.exitcode is not None for p in procs):
        with contextlib.suppress(queue.Empty):
            while True:  # an error report may still be in the queue
                kind, value = results.get(timeout=0.5)
                if kind == "error":
                    raise pickle.loads(value) from None  # the worker's own error, as it raised it
        codes = ", ".join(f"{p.name} exit {p.exitcode}" for p in procs if p.exitcode)
        raise EmbedWorkerError(
            f"a worker process died ({codes or 'no report'}) with parts "
            f"{sorted(remaining)[:10]} unfinished; the finished parts are kept in "
            f"{writer.folder}: rerun with "
            f"{option_wording('--resume', 'resume=True')}"
        ) from None


def _gather(
    procs: list, results, remaining: set[int], progress: Callable[[int], None], workers: int, writer: Any
) -> None:
    """Read the workers' reports until every part of ``remaining`` is done: lines done go to ``progress``, a
    worker's error is raised; checks for Ctrl-C and for dead workers (:func:`_check_workers`) between reports."""
    while remaining:
        interrupts.check()
        try:
            kind, value = results.get(timeout=0.2)
        except queue.Empty:
            _check_workers(procs, results, remaining, workers, writer)
            continue
        if kind == "n":
            progress(value)
        elif kind == "done":
            remaining.discard(value)
        elif kind == "error":
            raise pickle.loads(value)


def _stop(procs: list, tasks, results) -> None:
    """Stop the workers still running (SIGTERM, then SIGKILL after 10 s) and close the queues."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    tasks.close()
    results.close()


def run_workers(
    embedder, writer: Any, todo: list[int], progress: Callable[[int], None], *, workers: int, worker_threads: int
) -> None:
    """Write the parts ``todo`` with ``min(workers, len(todo))`` spawned worker processes, each with
    ``worker_threads`` torch threads; ``progress(n)`` counts the lines done. ``writer``: the run's
    :class:`~elmokit.embedding.writer.PartWriter` (picklable; sent to each worker with ``embedder``).

    Raises:
        UsageError: the workers could not start because the calling script runs ``embed_file`` at its top level.
        EmbedWorkerError: a worker died (names its exit status and the unfinished parts; the finished parts are kept
            for ``resume``); the error a worker raised is raised as it is.
        KeyboardInterrupt: Ctrl-C/SIGTERM (the workers are stopped).
    """
    ctx = mp.get_context("spawn")
    n = min(workers, len(todo))
    tasks, results = _queues(ctx, todo, n)
    procs = [
        ctx.Process(
            target=_worker_main,
            daemon=True,
            name=f"elmokit-embed-{w}",
            args=(embedder, writer, worker_threads, tasks, results, os.getpid()),
        )
        for w in range(n)
    ]
    try:
        # not cut half way (a child fed a truncated pickle prints a traceback), and the children start with
        # Ctrl-C/SIGTERM blocked: pending until their handler is installed (_worker_main), never a traceback from
        # the middle of their imports when Ctrl-C reaches the whole process group
        with interrupts.deferred(), interrupts.blocked():
            for p in procs:
                p.start()
        _gather(procs, results, set(todo), progress, workers, writer)
        for p in procs:
            p.join(timeout=30)
    finally:
        _stop(procs, tasks, results)
