"""Helpers for the ``elmokit serve`` tests: a tiny random model saved as a folder, and a real server (uvicorn on a
loopback port, in a thread of the test process) around it."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from pathlib import Path

import pytest

from helpers import tiny_random_bilm

pytest.importorskip("fastapi", reason="the serve extra (pip install 'elmokit[serve]') is not installed")

from elmokit.embedding import Embedder  # noqa: E402
from elmokit.serving.app import create_app, load_embedder  # noqa: E402
from elmokit.serving.runner import _Server, bind, uvicorn  # noqa: E402
from elmokit.serving.settings import ServeSettings  # noqa: E402
from elmokit.weights.native import save_pretrained  # noqa: E402

KEY = "test-key"

#: Sentences of several lengths (the longest, 13 tokens, still fits 4 to a batch of 64 padded positions).
SENTENCES = [
    "The bank raised interest rates .".split(),
    "They walked along the bank of the river .".split(),
    ["a"],
    "He borrowed money from the bank to buy a house near the water".split(),
    "Fishermen sat on the grassy bank .".split(),
    "ok".split(),
    "the river bank was muddy after the rain".split(),
]


def save_tiny_model(folder: Path) -> Path:
    """The tiny random BiLM (tests/helpers.py, seed 0) saved in elmokit's format."""
    return save_pretrained(tiny_random_bilm(0), folder)


@contextlib.contextmanager
def running_server(settings: ServeSettings, embedder: Embedder | None = None):
    """Serve ``settings`` (its model loaded unless ``embedder``) on a free loopback port in a thread; yields
    ``(base_url, state)``; stops the server (gracefully) afterwards."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    guard = create_app(settings, embedder if embedder is not None else load_embedder(settings))
    server = _Server(uvicorn.Config(guard, lifespan="on", log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and guard.state.batcher.ready.is_set()):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", guard.state
    finally:
        server.should_exit = True
        thread.join(30)


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus exposition ``text`` (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if (
            m
            and m.group(1) == name
            and ",".join(sorted((m.group(2) or "").split(","))) == ",".join(sorted(want.split(",")))
        ):
            return float(m.group(3))
    return 0.0


def within_bound(got, want) -> bool:
    """``Embedder.embed_sentences``' documented batch-independence bound: each layer within 1e-5 of its largest
    |value| (absolute below 1)."""
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False
    layers = [(got, want)] if want.ndim < 3 else list(zip(got, want))
    return all(np.abs(g - w).max(initial=0) <= 1e-5 * max(1.0, np.abs(w).max(initial=0)) for g, w in layers)
