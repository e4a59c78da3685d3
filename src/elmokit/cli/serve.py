"""``elmokit serve MODEL``: the HTTP embedding service (:mod:`elmokit.serving`), one model loaded at start-up.

Loopback (``127.0.0.1``) by default; a ``--host`` that is not loopback needs an API key (clients send ``Authorization:
Bearer KEY``: ``--api-key-file PATH``, ``ELMOKIT_API_KEY`` or ``--api-key KEY``) or ``--insecure-no-auth``. SIGTERM
or Ctrl-C stops accepting, answers the accepted requests, gives their clients ``--shutdown-timeout`` seconds to read
the answers and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from elmokit.cli.common import (
    DEVICE_HELP,
    RELEASED_HELP,
    add_threads_option,
    check_model,
    non_negative_int,
    path_arg,
    positive_float,
    positive_int,
    resolve_cli_device,
    text_arg,
)
from elmokit.errors import ElmoError, MissingFileError, UsageError

__all__ = ["register", "cmd_serve", "API_KEY_ENV"]

#: The environment variable that may hold the API key (not shown by ``ps``, unlike ``--api-key KEY``).
API_KEY_ENV = "ELMOKIT_API_KEY"


def _api_key(args: argparse.Namespace) -> str | None:
    """The API key: ``--api-key KEY`` or ``--api-key-file PATH`` (at most one of them), else ``ELMOKIT_API_KEY``, else
    none. The command line wins over the environment. Raises UsageError / MissingFileError naming the source: both
    options, an empty key, a file that cannot be read or holds several lines."""
    if args.api_key is not None and args.api_key_file is not None:
        raise UsageError("give one of --api-key and --api-key-file, not both")
    if args.api_key is not None:
        key, source = args.api_key, "--api-key"
    elif args.api_key_file is not None:
        key, source = _read_key_file(args.api_key_file), f"--api-key-file {args.api_key_file}"
    elif API_KEY_ENV in os.environ:
        key, source = os.environ[API_KEY_ENV], API_KEY_ENV
    else:
        return None
    key = key.strip()
    if not key:
        raise UsageError(f"{source} is empty: give a secret string")
    if "\n" in key or "\r" in key:
        raise UsageError(f"{source} holds several lines: the key is one line (clients send it in a header)")
    return key


def _read_key_file(path: Path) -> str:
    """The text of ``--api-key-file``. Raises MissingFileError / UsageError naming the path and the reason."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"--api-key-file {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--api-key-file {path} is a folder: give the file holding the key") from None
    except OSError as exc:
        raise UsageError(f"--api-key-file {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--api-key-file {path} is not UTF-8 text: put the key on one line") from None


def _openai_layers_checked(settings, num_layers: int | None = None):
    """``--openai-layers`` as an output spec (against ``num_layers`` when given). Raises UsageError naming the
    option."""
    from elmokit.embedding.pooling import OutputSpec  # lazy: CLI start-up
    from elmokit.serving.settings import as_option  # lazy: CLI start-up

    try:
        return OutputSpec.make(settings.openai_layers, settings.openai_pool, num_layers=num_layers)
    except ElmoError as exc:
        raise UsageError(as_option(str(exc), "--openai-layers", settings.openai_layers, "layers")) from None


def _settings(args: argparse.Namespace):
    """The :class:`~elmokit.serving.settings.ServeSettings` of the command line (checked: the model, the device,
    the bind rule). Raises UsageError / MissingFileError naming the option."""
    from elmokit.serving.settings import ServeSettings, plain_host  # lazy: CLI start-up
    from elmokit.weights.native import resolve_model_name  # lazy: CLI start-up

    model = str(resolve_model_name(args.model))
    check_model(model)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535 (0: any free port), got {args.port}")
    settings = ServeSettings(
        model=model,
        host=plain_host(args.host),
        port=args.port,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_sentences=args.max_batch_sentences,
        max_wait_ms=args.max_wait_ms,
        max_concurrent_requests=args.max_concurrent_requests,
        max_client_sentences=args.max_client_sentences,
        max_tokens_per_sentence=args.max_tokens_per_sentence,
        payload_limit=args.payload_limit,
        body_timeout_s=args.body_timeout,
        shutdown_timeout_s=args.shutdown_timeout,
        max_occurrences=args.max_occurrences,
        max_response_values=args.max_response_values,
        api_key=_api_key(args),
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
    from elmokit.serving.runner import bind, serve  # lazy: loads uvicorn only for this command

    settings = _settings(args)
    _openai_layers_checked(settings)  # a bad --openai-layers form: before any work (a layer it lacks: at load)
    sock = bind(settings.host, settings.port)
    settings = dataclasses.replace(settings, port=sock.getsockname()[1])  # --port 0: /info shows the bound port

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


def _add_time_options(p: argparse.ArgumentParser) -> None:
    """How long a client may take to send its request, and to read its answer at shutdown."""
    p.add_argument(
        "--body-timeout",
        type=positive_float,
        default=30.0,
        help="seconds a client has to send its whole request body; a slower one gets 408 (default: %(default)s)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="after SIGTERM or Ctrl-C, once every accepted request is answered, seconds its client has to read the "
        "answer; connections still open then (a client that never reads) are closed, and the server exits 0 "
        "(default: %(default)s)",
    )


def _add_access_options(p: argparse.ArgumentParser) -> None:
    """Who may call (API key, CORS), where and how the model runs, and the text and OpenAI-route rules."""
    p.add_argument(
        "--api-key-file",
        type=path_arg,
        default=None,
        metavar="PATH",
        help="require 'Authorization: Bearer KEY' on every route but /, /examples and /health, KEY being this file's "
        f"one line (safer than --api-key, which every local user sees in ps; or set {API_KEY_ENV}; default: none)",
    )
    p.add_argument(
        "--api-key",
        type=str,
        default=None,
        metavar="KEY",
        help=f"as --api-key-file, the key given here (visible in ps: prefer --api-key-file or {API_KEY_ENV}; "
        f"either option wins over {API_KEY_ENV}; default: none)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a --host that is not loopback without an API key (default: refuse)",
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
        "tokens/s at batch 64; docs/explanation/numerics.md) (default: off)",
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
    _add_time_options(p)
    _add_access_options(p)
    add_threads_option(p)
    p.set_defaults(func=cmd_serve, interrupted_note=lambda args: "the server stopped before it started")
