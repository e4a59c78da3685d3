"""``elmokit serve MODEL``: the HTTP embedding service (:mod:`elmokit.serving`), one model loaded at start-up.

Loopback (``127.0.0.1``) by default; any other ``--host`` needs ``--api-key KEY`` (clients send ``Authorization:
Bearer KEY``) or ``--insecure-no-auth``. SIGTERM or Ctrl-C stops accepting, answers the accepted requests and exits 0.
"""

from __future__ import annotations

import argparse
import sys

from elmokit.cli.common import (
    DEVICE_HELP,
    RELEASED_HELP,
    add_threads_option,
    check_model,
    non_negative_int,
    positive_float,
    positive_int,
    resolve_cli_device,
    text_arg,
)
from elmokit.errors import UsageError

__all__ = ["register", "cmd_serve"]


def _settings(args: argparse.Namespace):
    """The :class:`~elmokit.serving.settings.ServeSettings` of the command line (checked: the model, the device,
    the bind rule). Raises UsageError / MissingFileError naming the option."""
    from elmokit.serving.settings import ServeSettings  # lazy: CLI start-up
    from elmokit.weights.native import resolve_model_name  # lazy: CLI start-up

    model = str(resolve_model_name(args.model))
    check_model(model)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535 (0: any free port), got {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError("--api-key is empty: give a secret string")
    settings = ServeSettings(
        model=model,
        host=args.host,
        port=args.port,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_sentences=args.max_batch_sentences,
        max_wait_ms=args.max_wait_ms,
        max_concurrent_requests=args.max_concurrent_requests,
        max_client_sentences=args.max_client_sentences,
        max_tokens_per_sentence=args.max_tokens_per_sentence,
        payload_limit=args.payload_limit,
        body_timeout_s=args.body_timeout,
        max_occurrences=args.max_occurrences,
        max_response_values=args.max_response_values,
        api_key=args.api_key,
        cors_origins=tuple(args.cors_origin or ()),
        device=str(resolve_cli_device(args.device)),
        precision=args.precision,
        batch_invariant=args.batch_invariant,
        workers=args.workers,
        tokenizer=args.tokenizer,
        openai_layers=args.openai_layers,
        threads=args.threads,
        recent_word_cache=args.recent_word_cache,
        inference_loops=args.inference_loops,
    )
    settings.check_bind(args.insecure_no_auth)
    if args.openai_layers == "all":
        raise UsageError("--openai-layers all gives several vectors a string; choose top, average, a layer or weights")
    return settings


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the options, bind the port, load the model (each worker its own), serve until SIGTERM/Ctrl-C."""
    from elmokit.embedding.pooling import OutputSpec  # lazy: CLI start-up
    from elmokit.serving.runner import bind, serve  # lazy: loads uvicorn only for this command

    settings = _settings(args)
    OutputSpec.make(settings.openai_layers, settings.openai_pool)  # a bad --openai-layers: before any work
    sock = bind(settings.host, settings.port)

    def announce(port: int) -> None:
        shown = f"[{settings.host}]" if ":" in settings.host else settings.host
        print(
            f"elmokit serve: {settings.model} on http://{shown}:{port}/ ({settings.workers} worker(s)); "
            "SIGTERM or Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )

    return serve(settings, sock, announce=announce)


def _add_batching_options(p: argparse.ArgumentParser) -> None:
    """MODEL, where to listen, and the batching budget and request limits."""
    p.add_argument("model", type=text_arg, help=f"{RELEASED_HELP}, or elmokit-en / elmokit-zh")
    p.add_argument("--host", type=text_arg, default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port; 0 picks a free one (default: %(default)s)")
    p.add_argument("--workers", type=positive_int, default=1, help="processes, each with its own model (default: 1)")
    p.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=8192,
        help="padded token positions per forward pass (default: %(default)s)",
    )
    p.add_argument(
        "--max-batch-sentences", type=positive_int, default=64, help="sentences per forward pass (default: %(default)s)"
    )
    p.add_argument(
        "--max-wait-ms",
        type=positive_float,
        default=2.0,
        help="how long a queued sentence waits for others to join its batch (default: %(default)s)",
    )
    p.add_argument(
        "--inference-loops",
        type=positive_int,
        default=1,
        help="inference loops (threads) per process sharing its queue: a pass over a small batch keeps about one "
        "core busy, so a second loop uses a second core (default: %(default)s)",
    )
    p.add_argument(
        "--recent-word-cache",
        type=non_negative_int,
        default=50_000,
        help="keep the layer-0 vectors of this many recently seen words, so a word met again skips the character "
        "CNN (50,000 x P x 4 bytes: 26 MB at P = 128; 0: off; default: %(default)s)",
    )
    p.add_argument(
        "--max-concurrent-requests",
        type=positive_int,
        default=512,
        help="requests in flight; more get 429 (default: %(default)s)",
    )
    p.add_argument(
        "--max-client-sentences",
        type=positive_int,
        default=256,
        help="sentences in one request; more get 422 (default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens-per-sentence",
        type=positive_int,
        default=512,
        help="tokens in one sentence; more get 422 (default: %(default)s)",
    )
    p.add_argument(
        "--payload-limit",
        type=positive_int,
        default=2_000_000,
        help="request body bytes; more get 413 (default: %(default)s)",
    )
    p.add_argument(
        "--max-response-values",
        type=positive_int,
        default=8_000_000,
        help="numbers in one /embed answer (positions x layers x width: 32 MB as .npz, ~160 MB as JSON); more "
        "get 422 (default: %(default)s)",
    )
    p.add_argument(
        "--max-occurrences",
        type=positive_int,
        default=256,
        help="occurrences of the word /similar compares (an n x n matrix per layer); more get 422 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--body-timeout",
        type=positive_float,
        default=30.0,
        help="seconds a client has to send its whole request body; a slower one gets 408 (default: %(default)s)",
    )


def _add_access_options(p: argparse.ArgumentParser) -> None:
    """Who may call (API key, CORS), where and how the model runs, and the text and OpenAI-route rules."""
    p.add_argument(
        "--api-key",
        type=str,
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /, /examples and /health (default: none)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a non-loopback --host without --api-key (default: refuse)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="allow this browser origin (repeatable; default: no CORS)",
    )
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")
    p.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="matrix products in (default: %(default)s)"
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="fp32 CPU: a sentence's vectors the same bits whatever dynamic batch it lands in (0.72× the "
        'tokens/s at batch 64; README "Batch independence, stated") (default: off)',
    )
    p.add_argument(
        "--tokenizer",
        choices=["whitespace", "moses", "jieba"],
        default="whitespace",
        help="for texts and /v1/embeddings (default: %(default)s)",
    )
    p.add_argument(
        "--openai-layers",
        type=text_arg,
        default="average",
        help="/v1/embeddings layer rule: top, average, a layer or weights (default: %(default)s)",
    )


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``elmokit serve``."""
    p = sub.add_parser(
        "serve",
        parents=parents,
        help="serve embeddings over HTTP (dynamic batching, /metrics, an OpenAI-compatible route, a polysemy page)",
        description="Serve MODEL over HTTP: POST /embed, /v1/embeddings (OpenAI schema), /similar; GET /health, "
        "/info, /metrics and / (the polysemy page). Requests are batched dynamically by a token budget. Needs "
        "pip install 'elmokit[serve]'.",
    )
    _add_batching_options(p)
    _add_access_options(p)
    add_threads_option(p)
    p.set_defaults(func=cmd_serve, interrupted_note=lambda args: "the server stopped before it started")
