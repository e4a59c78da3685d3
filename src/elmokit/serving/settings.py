"""The server's settings: the model, the batching budget and every limit a request meets (``elmokit serve``'s options).

They travel as JSON in the environment variable :data:`SETTINGS_ENV` to the worker processes of ``--workers N``
(each loads its own model) and are shown by ``GET /info``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from dataclasses import dataclass

from elmokit.errors import UsageError

__all__ = ["ServeSettings", "SETTINGS_ENV", "LOOPBACK_HOSTS", "is_loopback", "plain_host", "as_option"]

#: The environment variable that carries the settings (JSON) to the worker processes.
SETTINGS_ENV = "ELMOKIT_SERVE_SETTINGS"

#: Host names (besides loopback addresses, :func:`is_loopback`) that only this machine can reach: serving on any other
#: host needs ``--api-key`` or ``--insecure-no-auth``.
LOOPBACK_HOSTS = ("localhost",)


def plain_host(host: str) -> str:
    """``host`` without the brackets of an IPv6 literal as written in a URL (``[::1]`` → ``::1``)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """Whether ``host`` can be reached only from this machine: a loopback address (``ipaddress``' ``is_loopback``:
    all of ``127.0.0.0/8``, ``::1``, an IPv4-mapped ``::ffff:127.x.y.z``; an IPv6 literal with or without its
    brackets) or the name ``localhost``. Any other name is not (it may resolve to anything)."""
    host = plain_host(host)
    if host.lower() in LOOPBACK_HOSTS:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def as_option(message: str, option: str, value: str, name: str) -> str:
    """A library message about argument ``name`` (``"layers=7 is not …"``, ``"layers '-1': expected …"``) as one
    about the command-line ``option`` the user typed (``"--openai-layers 7 is not …"``); a message that does not
    start with ``name`` is prefixed with ``"{option} {value}: "``. A message already in the command line's wording
    (``"--layers 7 is not …"``, ``"a fixed mix (--layers) needs …"``: the library words it so inside a command) names
    ``option`` instead, since ``--layers`` is not what the user typed."""
    message = message.replace(f" (--{name})", "")
    for head in (f"{name}={value}", f"{name} {value!r}", f"{name}={value!r}", f"--{name} {value}"):
        if message.startswith(head):
            return f"{option} {value}{message[len(head) :]}"
    return f"{option} {value}: {message}"


@dataclass(frozen=True)
class ServeSettings:
    """What ``elmokit serve`` was started with.

    Attributes:
        model: the model folder, original-format folder or released name (loaded once at start-up).
        host / port: where to listen (default loopback, 8080).
        max_batch_tokens: padded token positions per forward pass (B × longest sentence).
        max_batch_sentences: sentences per forward pass.
        max_wait_ms: how long the oldest queued sentence waits for others to join its batch (ms).
        max_concurrent_requests: embedding requests (``/embed``, ``/v1/embeddings``, ``/similar``) in flight at once;
            one more is answered 429 with ``Retry-After``.
        max_client_sentences: sentences (or texts) in one request; more is answered 422.
        max_tokens_per_sentence: tokens in one sentence; more is answered 422.
        payload_limit: request body bytes; more is answered 413.
        max_response_values: numbers in one ``/embed`` answer (positions × layers × width); more is answered 422.
        max_occurrences: occurrences of the word ``/similar`` compares (an n × n matrix a layer); more is 422.
        body_timeout_s: seconds a client has to send its whole body; a slower one is answered 408.
        shutdown_timeout_s: after SIGTERM, once every accepted request has been answered, seconds the clients have
            to read their answers; connections still open then (a client that never reads) are closed.
        api_key: the Bearer token every route but ``/``, ``/examples`` and ``/health`` requires (``None``: none).
        cors_origins: origins allowed by CORS (empty: no CORS headers).
        device / precision: where and how the model runs (:class:`~elmokit.Embedder`'s options).
        batch_invariant: the batch-invariant kernels (``Embedder(batch_invariant=True)``): a sentence's vectors the
            same bits whatever dynamic batch it lands in (0.72× the tokens/s at batch 64).
        workers: processes, each with its own model and inference loop, sharing the port.
        tokenizer: how ``texts`` and the OpenAI route's strings become tokens when a request does not say.
        openai_layers / openai_pool: the layer rule and pooling of ``/v1/embeddings`` sentence vectors.
        threads: torch threads per process.
        recent_word_cache: words whose layer-0 vectors each process keeps (``Embedder(recent_word_cache=…)``; 0: off).
        inference_loops: inference loops (threads) per process taking batches from its queue
            (:class:`~elmokit.serving.batcher.Batcher`'s ``loops``).
    """

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch_tokens: int = 8192
    max_batch_sentences: int = 64
    max_wait_ms: float = 2.0
    max_concurrent_requests: int = 512
    max_client_sentences: int = 256
    max_tokens_per_sentence: int = 512
    payload_limit: int = 2_000_000
    body_timeout_s: float = 30.0
    shutdown_timeout_s: float = 5.0
    max_occurrences: int = 256
    max_response_values: int = 8_000_000
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    device: str | None = None
    precision: str = "fp32"
    batch_invariant: bool = False
    workers: int = 1
    tokenizer: str = "whitespace"
    openai_layers: str = "average"
    openai_pool: str = "mean"
    threads: int | None = None
    recent_word_cache: int = 50_000
    inference_loops: int = 1

    def check_bind(self, insecure_no_auth: bool) -> None:
        """Raise :class:`UsageError` when the server would listen beyond this machine without an API key (unless
        ``insecure_no_auth``)."""
        if not is_loopback(self.host) and self.api_key is None and not insecure_no_auth:
            raise UsageError(
                f"--host {self.host} can be reached from other machines: give an API key (--api-key-file PATH, "
                "ELMOKIT_API_KEY or --api-key KEY; clients send 'Authorization: Bearer KEY'), or --insecure-no-auth "
                "to serve without one"
            )

    def limits(self) -> dict:
        """The limits a client meets (``/info``)."""
        names = (
            "max_batch_tokens",
            "max_batch_sentences",
            "max_wait_ms",
            "max_concurrent_requests",
            "max_client_sentences",
            "max_tokens_per_sentence",
            "payload_limit",
            "body_timeout_s",
            "shutdown_timeout_s",
            "max_occurrences",
            "max_response_values",
        )
        return {name: getattr(self, name) for name in names}

    def public(self) -> dict:
        """The settings without the API key (``/info``): whether one is required instead."""
        out = dataclasses.asdict(self)
        out["api_key"] = "required" if self.api_key else None
        out["cors_origins"] = list(self.cors_origins)
        return out

    def to_env(self) -> None:
        """Put these settings into :data:`SETTINGS_ENV` (for the worker processes)."""
        os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> ServeSettings:
        """The settings :meth:`to_env` stored. Raises :class:`UsageError` when there are none."""
        text = os.environ.get(SETTINGS_ENV)
        if not text:
            raise UsageError(f"{SETTINGS_ENV} is not set: start the server with `elmokit serve MODEL`")
        data = json.loads(text)
        data["cors_origins"] = tuple(data.get("cors_origins") or ())
        return cls(**data)
