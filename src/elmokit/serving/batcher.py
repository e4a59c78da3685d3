"""Dynamic batching: one inference loop per process, fed by a queue of sentences from many requests.

A request's sentences are queued one by one (:meth:`Batcher.submit`); the loop (:meth:`Batcher.run`, one thread) takes
from the head of the queue the sentences that share the oldest sentence's :class:`~elmokit.embedding.pooling.OutputSpec`
while the batch stays within ``max_batch_sentences`` sentences and ``max_batch_tokens`` padded positions (B × the
longest sentence's tokens, as :class:`~elmokit.Embedder` counts them; a longer sentence goes alone), waiting at most
``max_wait_ms`` after the oldest sentence arrived for more to come. So a request larger than a batch is split over
several passes and reassembled in input order, and small requests share passes. Each pass is one
:meth:`Embedder.embed_batch` call, whose values do not depend on the batch beyond float rounding (its documented
batch-independence bound). A cancelled request (the client went away) has its sentences still in the queue dropped.

The design follows text-embeddings-inference's router (a queue and a batching loop by token budget and wait).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import numpy as np

from elmokit.checks import positive_int
from elmokit.embedding.pooling import OutputSpec

__all__ = ["Batcher", "Job", "BatchStats", "WorkerStopped"]

logger = logging.getLogger(__name__)


class WorkerStopped(RuntimeError):
    """The inference loop has stopped (shut down, or it failed): the job cannot be answered."""


def _settle(future: Future, result: object = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless it is already done (a cancelled job's future may be cancelled at any moment)."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:  # cancelled between the check and the call
        pass


@dataclass
class Job:
    """One request's sentences: ``results[i]`` is sentence i's array once embedded; ``future`` resolves to the list
    when every sentence is done (or to :class:`WorkerStopped` / the embedder's error)."""

    sentences: Sequence[Sequence[str]]
    spec: OutputSpec
    results: list = field(default_factory=list)
    remaining: int = 0
    cancelled: bool = False
    future: Future = field(default_factory=Future)


@dataclass
class _Item:
    job: Job
    index: int
    tokens: int
    enqueued: float


@dataclass(frozen=True)
class BatchStats:
    """What one forward pass did: ``sentences``, ``padded_tokens`` (B × longest), ``real_tokens``, ``seconds``."""

    sentences: int
    padded_tokens: int
    real_tokens: int
    seconds: float


class Batcher:
    """The queue and the inference loop (see the module docstring).

    Args:
        embedder: an :class:`~elmokit.Embedder` (its ``embed_batch`` is called from the loop's thread only).
        max_batch_tokens: padded token positions per forward pass (B × longest sentence; a longer one goes alone).
        max_batch_sentences: sentences per forward pass.
        max_wait_ms: how long the oldest queued sentence may wait for others to join its batch (milliseconds).
        on_batch: called after each pass with its :class:`BatchStats` (metrics; from the loops' threads).
        loops: inference loops (threads) taking batches from the one queue. A pass over a small batch keeps about one
            core busy whatever torch's thread count (its products are too small to split), so on a machine with more
            cores than one pass uses, a second loop runs a second batch meanwhile; each loop calls
            ``embedder.embed_batch`` (an :class:`~elmokit.Embedder` may be called from several threads).

    ``queued`` is the number of sentences waiting; ``ready`` is set once the probe sentence has embedded and stays set
    while the loops run; ``alive`` says whether every loop thread is running (when one stops on an error, the others
    finish their pass and stop too).

    Raises:
        UsageError: ``loops`` not a positive int.
    """

    def __init__(
        self,
        embedder,
        *,
        max_batch_tokens: int = 8192,
        max_batch_sentences: int = 64,
        max_wait_ms: float = 2.0,
        on_batch: Callable[[BatchStats], None] | None = None,
        loops: int = 1,
    ) -> None:
        self.embedder = embedder
        self.loops = positive_int("loops", loops)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_sentences = max_batch_sentences
        self.max_wait = max_wait_ms / 1000.0
        self.on_batch = on_batch
        self._queue: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._paused = False
        self._threads: list[threading.Thread] = []
        self._waiting = 0  # loops inside _next_batch (waiting for work or taking a batch)
        self.ready = threading.Event()
        self.error: BaseException | None = None

    # -------------------------------------------------------------------------------------------- control
    def start(self) -> None:
        """Start the loop threads; each embeds a probe sentence first, and the first to finish sets :attr:`ready`."""
        names = ["elmokit-inference"] if self.loops == 1 else [f"elmokit-inference-{i}" for i in range(self.loops)]
        self._threads = [threading.Thread(target=self.run, name=name, daemon=True) for name in names]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish the queued work, then stop the loop (later submissions fail with :class:`WorkerStopped`)."""
        with self._cond:
            self._stopping = True
            self._paused = False
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.ready.clear()

    def pause(self) -> None:
        """Hold the queue: no new forward pass starts until :meth:`resume` (tests use it to observe queued work)."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return bool(self._threads) and all(thread.is_alive() for thread in self._threads)

    @property
    def queued(self) -> int:
        return len(self._queue)

    # -------------------------------------------------------------------------------------------- requests
    def submit(self, sentences: Sequence[Sequence[str]], spec: OutputSpec) -> Job:
        """Queue validated ``sentences`` under ``spec``; returns the :class:`Job` (its ``future`` gives the arrays, in
        input order). An empty list resolves at once. Raises :class:`WorkerStopped` when the loop is not running."""
        job = Job(sentences, spec, [None] * len(sentences), len(sentences))
        if not sentences:
            job.future.set_result([])
            return job
        now = time.monotonic()
        with self._cond:
            if self._stopping or not self.alive:
                raise WorkerStopped("the inference worker is not running")
            self._queue.extend(_Item(job, i, len(s), now) for i, s in enumerate(sentences))
            self._cond.notify_all()
        return job

    def cancel(self, job: Job) -> int:
        """Drop ``job``'s sentences still in the queue (a pass already running finishes); returns how many."""
        with self._cond:
            job.cancelled = True
            before = len(self._queue)
            self._queue = deque(item for item in self._queue if item.job is not job)
            dropped = before - len(self._queue)
        if not job.future.done():
            job.future.cancel()
        return dropped

    # -------------------------------------------------------------------------------------------- the loop
    def _enough(self) -> bool:
        """Whether the queue already holds a full batch (no reason to wait longer)."""
        if len(self._queue) >= self.max_batch_sentences:
            return True
        longest = max(item.tokens for item in self._queue)
        return len(self._queue) * longest >= self.max_batch_tokens

    def _take(self) -> list[_Item]:
        """The next batch (called with the lock held, the queue not empty): the oldest sentence's spec, in queue
        order, within the sentence and padded-token budgets. With several loops waiting for work, a loop takes only
        its share of the queue (the queued sentences ÷ the waiting loops, rounded up) and wakes another for the rest:
        two half batches on two cores finish sooner than one whole batch on one."""
        spec = self._queue[0].job.spec
        batch: list[_Item] = []
        rest: deque[_Item] = deque()
        longest = 0
        cap = self.max_batch_sentences
        if self._waiting > 1:
            cap = min(cap, -(-len(self._queue) // self._waiting))
        for item in self._queue:
            fits = len(batch) < cap
            fits = fits and (len(batch) + 1) * max(longest, item.tokens) <= self.max_batch_tokens
            if item.job.spec == spec and (fits or not batch):
                batch.append(item)
                longest = max(longest, item.tokens)
            else:
                rest.append(item)
        self._queue = rest
        if rest and self._waiting > 1:
            self._cond.notify()
        return batch

    def _next_batch(self) -> list[_Item] | None:
        """Wait for work and return the next batch; ``None`` when stopping with an empty queue."""
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    while (not self._queue or self._paused) and not (self._stopping and not self._queue):
                        self._cond.wait()
                    if not self._queue:
                        return None
                    deadline = self._queue[0].enqueued + self.max_wait
                    now = time.monotonic()
                    if self._stopping or self._enough() or now >= deadline:
                        return self._take()
                    self._cond.wait(deadline - now)
            finally:
                self._waiting -= 1

    def run(self) -> None:
        """The loop (the thread's target): a probe sentence, then batches until :meth:`stop`."""
        running: list[_Item] = []
        try:
            self.embedder.embed_batch([["probe"]], layers="top", pool="mean")
            self.ready.set()
            while (batch := self._next_batch()) is not None:
                running = batch
                self._run_batch(batch)
                running = []
        except BaseException as exc:  # noqa: BLE001 — the loop must report why it stopped, whatever it was
            self.error = exc
            logger.exception("the inference loop stopped")
        finally:
            self.ready.clear()
            with self._cond:
                self._stopping = True
                left, self._queue = list(self._queue), deque()
            for item in running + left:  # the pass it stopped in (a BaseException in it), and what waited
                _settle(item.job.future, error=WorkerStopped("the inference worker stopped"))

    def _run_batch(self, batch: list[_Item]) -> None:
        batch = [item for item in batch if not item.job.cancelled]
        if not batch:
            return
        spec = batch[0].job.spec
        start = time.perf_counter()
        try:
            arrays = self.embedder.embed_batch(
                [item.job.sentences[item.index] for item in batch],
                layers=spec.layers,
                pool=spec.pool,
                keep_sentence_boundaries=spec.keep_sentence_boundaries,
                dtype=spec.dtype,
            )
        except Exception as exc:  # noqa: BLE001 — the requests of this batch get the error; the loop goes on
            for item in batch:
                _settle(item.job.future, error=exc)
            return
        seconds = time.perf_counter() - start
        for item, arr in zip(batch, arrays):
            job = item.job
            job.results[item.index] = arr
            job.remaining -= 1
            if job.remaining == 0:
                _settle(job.future, job.results)
        if self.on_batch is not None:
            longest = max(item.tokens for item in batch)
            real = sum(item.tokens for item in batch)
            self.on_batch(BatchStats(len(batch), longest * len(batch), real, seconds))

    def embed_sync(self, sentences: Sequence[Sequence[str]], spec: OutputSpec) -> list[np.ndarray]:
        """Submit and wait (from a thread other than the loop's): the arrays in input order."""
        return self.submit(sentences, spec).future.result()
