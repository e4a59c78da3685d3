"""``elmokit serve``: an HTTP embedding service with dynamic batching, Prometheus metrics, an OpenAI-compatible
route and a polysemy page (``pip install 'elmokit[serve]'``).

* :mod:`~elmokit.serving.settings`: the options and limits (``ServeSettings``);
* :mod:`~elmokit.serving.batcher`: the queue and its inference loops (``--inference-loops``; token budget, maximum wait,
  large requests split and reassembled);
* :mod:`~elmokit.serving.schemas`: request checks (422 naming field and index) and the binary (``.npz``) encoding;
* :mod:`~elmokit.serving.app`: the routes and statuses (FastAPI; the two embedding routes answered by its outer ASGI
  layer); :mod:`~elmokit.serving.metrics`: ``/metrics``;
* :mod:`~elmokit.serving.runner`: uvicorn, ``--workers N``, graceful SIGTERM;
* ``page/index.html``: the polysemy page (plain HTML and JavaScript, nothing fetched from elsewhere).

Only :mod:`~elmokit.serving.settings` and :mod:`~elmokit.serving.batcher` import without the ``serve`` extra.
"""

from __future__ import annotations

from elmokit.serving.settings import ServeSettings

__all__ = ["ServeSettings"]
