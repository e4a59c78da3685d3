"""Prometheus metrics of one server process (``GET /metrics``), each in the app's own registry.

* ``elmokit_requests_total{route,status}`` and ``elmokit_request_duration_seconds{route,status}`` (histogram);
* ``elmokit_requests_in_flight`` (embedding requests being answered), ``elmokit_queue_sentences`` (waiting);
* ``elmokit_batch_sentences`` / ``elmokit_batch_tokens`` (padded positions) / ``elmokit_batch_real_tokens`` and
  ``elmokit_inference_seconds`` per forward pass (histograms), ``elmokit_embedded_sentences_total``;
* ``elmokit_dropped_sentences_total``: queued sentences of requests whose client went away;
* ``elmokit_recent_word_hits_total`` / ``elmokit_recent_word_misses_total``: distinct words of each pass found in the
  recent-word cache (``--recent-word-cache``) and encoded from their characters (read from the cache's own counts
  at each scrape; absent without the cache).

With ``--workers N`` each process has its own (the scrape reaches whichever process takes it).
"""

from __future__ import annotations

from elmokit.errors import import_optional
from elmokit.serving.batcher import BatchStats

__all__ = ["Metrics", "ROUTES"]

prometheus_client = import_optional("prometheus_client", "serve", "the server's /metrics")

#: The routes counted by name; any other path is counted as ``other``.
ROUTES = ("/", "/embed", "/v1/embeddings", "/similar", "/health", "/info", "/metrics", "/examples")

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536)


class _RecentWordCounts:
    """A collector of the recent-word cache's hit and miss counts, read when scraped (the cache counts them itself,
    under its lock, whichever inference loop made the call)."""

    def __init__(self, recent_words) -> None:
        self.recent_words = recent_words

    def collect(self):
        family = prometheus_client.metrics_core.CounterMetricFamily
        yield family(
            "elmokit_recent_word_hits",
            "distinct words of a pass found in the recent-word cache",
            value=self.recent_words.hits,
        )
        yield family(
            "elmokit_recent_word_misses",
            "distinct words of a pass encoded from their characters",
            value=self.recent_words.misses,
        )


class Metrics:
    """The metrics (see the module docstring) in a fresh ``CollectorRegistry``, and the text of a scrape.

    Args:
        recent_words: the embedder's :class:`~elmokit.embedding.recent_words.RecentWordVectors` (its counts are
            exposed), or ``None``.
    """

    content_type = prometheus_client.CONTENT_TYPE_LATEST

    def __init__(self, recent_words=None) -> None:
        pc = prometheus_client
        self.registry = pc.CollectorRegistry()
        r = self.registry
        self.requests = pc.Counter(
            "elmokit_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.duration = pc.Histogram(
            "elmokit_request_duration_seconds", "request duration by route and status", ["route", "status"], registry=r
        )
        self.in_flight = pc.Gauge("elmokit_requests_in_flight", "embedding requests being answered", registry=r)
        self.queue = pc.Gauge("elmokit_queue_sentences", "sentences waiting for a forward pass", registry=r)
        self.batch_sentences = pc.Histogram(
            "elmokit_batch_sentences", "sentences per forward pass", buckets=_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = pc.Histogram(
            "elmokit_batch_tokens", "padded token positions per forward pass", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.batch_real_tokens = pc.Histogram(
            "elmokit_batch_real_tokens", "real tokens per forward pass", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.inference = pc.Histogram("elmokit_inference_seconds", "seconds per forward pass", registry=r)
        self.embedded = pc.Counter("elmokit_embedded_sentences", "sentences embedded", registry=r)
        self.dropped = pc.Counter(
            "elmokit_dropped_sentences", "queued sentences dropped because their client went away", registry=r
        )

        if recent_words is not None:
            r.register(_RecentWordCounts(recent_words))

    def observe_batch(self, stats: BatchStats) -> None:
        """Record one forward pass (the batcher's ``on_batch``)."""
        self.batch_sentences.observe(stats.sentences)
        self.batch_tokens.observe(stats.padded_tokens)
        self.batch_real_tokens.observe(stats.real_tokens)
        self.inference.observe(stats.seconds)
        self.embedded.inc(stats.sentences)

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        route = path if path in ROUTES else "other"
        self.requests.labels(route, str(status)).inc()
        self.duration.labels(route, str(status)).observe(seconds)

    def scrape(self, queued: int) -> bytes:
        """The exposition text, with the queue gauge set to ``queued`` first."""
        self.queue.set(queued)
        return prometheus_client.generate_latest(self.registry)
