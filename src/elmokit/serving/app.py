"""The HTTP application (FastAPI): one model per process, the routes, the limits and their statuses.

Routes (docs/tutorials/serving.md has examples; docs/reference/http.md every route, limit and status):

* ``POST /embed``: ``{"sentences": [["The", "bank"], …]}`` (token lists) or ``{"texts": [...], "tokenizer": …}``,
  options ``layers`` / ``pool`` / ``keep_sentence_boundaries`` / ``dtype`` as :meth:`Embedder.embed_batch`. JSON
  (tokens, shape and vectors per sentence), or an ``.npz`` archive with ``Accept: application/x-npz``
  (:mod:`elmokit.serving.schemas` says why npz; ``Accept`` is negotiated as RFC 9110 says, by its ``negotiate``:
  406 only when neither type is acceptable). Values are :meth:`Embedder.embed_batch`'s on the same sentences
  within its documented batch-independence bound (the batch a sentence shares is the server's choice).
* ``POST /v1/embeddings``: the OpenAI embeddings schema; sentence vectors are ``--openai-layers`` (default: the
  average of the L+1 layers) mean-pooled over real tokens (shown by ``/info``).
* ``POST /similar``: a word, sentences and optional labels → per-layer cosine matrices, their summaries (with labels
  the within/across gap) and each layer's 2-D projection: :mod:`elmokit.analysis.polysemy`'s functions, the numbers of
  ``elmokit similar --json``.
* ``GET /health`` (200 once the probe sentence has embedded; 503 before, or when the inference loop has stopped),
  ``GET /info``, ``GET /metrics`` (Prometheus), ``GET /`` (the polysemy page), ``GET /examples`` (its examples).

Statuses: 401 (no or wrong ``Authorization: Bearer`` key when the server has one; every route but ``/``,
``/examples``, ``/health``), 406 (an ``Accept`` that rules out both of ``/embed``'s types), 408 (the body not all
sent within ``--body-timeout``), 413 (body over ``--payload-limit``), 422 (invalid JSON, unknown fields, bad sentences
or options: one line naming the field and index, in the library's wording; a string holding a lone surrogate, named
as such), 429 with ``Retry-After`` (over ``--max-concurrent-requests``), 503 with ``Retry-After`` (no inference
loop). A client that disconnects while its sentences wait, or while it sends its body,
is logged as status 499 (its queued sentences dropped). Errors are JSON in the OpenAI error shape
``{"error": {"message", "type", "param", "code"}}``.

FastAPI (on Starlette) rather than bare Starlette: the same ASGI core, with the OpenAPI schema of the routes at
``/openapi.json`` for free; its interactive docs pages are off (they load scripts from a CDN).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.resources
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

from elmokit.analysis.polysemy import (
    find_occurrences,
    label_similarity,
    layer_names,
    layer_similarities,
    occurrence_vectors,
    plot_scale,
)
from elmokit.characters import validate_sentences
from elmokit.data.examples import APPLE_SENTENCES, BANK_SENTENCES
from elmokit.data.text_checks import is_cjk
from elmokit.embedding import Embedder
from elmokit.embedding.pooling import OutputSpec
from elmokit.errors import ElmoError, UsageError, import_optional
from elmokit.serving.batcher import Batcher, Job, WorkerStopped
from elmokit.serving.metrics import Metrics
from elmokit.serving.schemas import (
    EMBED_TYPES,
    NPZ_TYPE,
    EmbedRequest,
    RequestError,
    SimilarRequest,
    base64_vector,
    check_finite,
    float32_values,
    json_bytes,
    negotiate,
    not_acceptable,
    npz_bytes,
    parse_embed,
    parse_json,
    parse_openai,
    parse_similar,
)
from elmokit.serving.settings import ServeSettings, as_option
from elmokit.weights.fingerprint import bilm_fingerprint
from elmokit.weights.native import load_pretrained_bilm

__all__ = ["create_app", "app_from_env", "load_embedder", "ServerState"]

logger = logging.getLogger(__name__)

fastapi = import_optional("fastapi", "serve", "elmokit serve (the HTTP server)")
responses = import_optional("fastapi.responses", "serve", "elmokit serve (the HTTP server)")
Request = fastapi.Request
Response = responses.Response
#: Raised while a body is read when the client has gone (FastAPI's Request is Starlette's; its module defines it).
ClientDisconnect = sys.modules[Request.__module__].ClientDisconnect

#: Paths answered without the API key: the page and its examples (static, no model) and the health probe.
_OPEN_PATHS = ("/", "/health", "/examples")
_ROUTES = "the routes are POST /embed, /v1/embeddings, /similar; GET /health, /info, /metrics, /, /examples"


class _ClientGone(Exception):
    """The client disconnected while its work was queued."""


def load_embedder(settings: ServeSettings) -> Embedder:
    """The settings' model, loaded once: an :class:`~elmokit.Embedder` on ``device`` at ``precision``, with the
    batching budget as its ``max_batch_tokens`` and ``recent_word_cache`` words' layer-0 vectors kept. Raises the
    loaders' errors (naming the model)."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    return Embedder(
        load_pretrained_bilm(settings.model),
        device=settings.device,
        precision=settings.precision,
        batch_size=settings.max_batch_sentences,
        max_batch_tokens=settings.max_batch_tokens,
        recent_word_cache=settings.recent_word_cache,
        batch_invariant=settings.batch_invariant,
    )


class ServerState:
    """What one process serves: settings, embedder, batcher, metrics, and the count of requests in flight."""

    def __init__(self, settings: ServeSettings, embedder: Embedder) -> None:
        self.settings = settings
        self.embedder = embedder
        # the /v1/embeddings rule against this model (a layer it lacks: UsageError at start-up, not a 500 per request)
        try:
            self.openai_spec = embedder.output_spec(settings.openai_layers, settings.openai_pool)
        except ElmoError as exc:
            raise UsageError(as_option(str(exc), "--openai-layers", settings.openai_layers, "layers")) from None
        self.metrics = Metrics(getattr(embedder, "recent_words", None))
        self.batcher = Batcher(
            embedder,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_sentences=settings.max_batch_sentences,
            max_wait_ms=settings.max_wait_ms,
            on_batch=self.metrics.observe_batch,
            loops=settings.inference_loops,
        )
        self.in_flight = 0
        self.fingerprint = bilm_fingerprint(embedder.bilm)
        self.model_name = Path(str(settings.model)).name or str(settings.model)

    @contextlib.contextmanager
    def slot(self):
        """Hold one of the ``max_concurrent_requests`` slots; raise 429 (``Retry-After: 1``) when none is free, 503
        when the inference loop is not running."""
        if not self.batcher.ready.is_set():
            raise RequestError(
                503, "the model is not ready (starting, or its worker stopped)", None, {"Retry-After": "1"}
            )
        if self.in_flight >= self.settings.max_concurrent_requests:
            raise RequestError(
                429,
                f"too many requests in flight (--max-concurrent-requests {self.settings.max_concurrent_requests}): "
                "retry after a second",
                None,
                {"Retry-After": "1"},
            )
        self.in_flight += 1
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()

    async def run(self, request: Request, sentences: list[list[str]], spec: OutputSpec) -> list[np.ndarray]:
        """Queue the sentences and wait for their arrays; a client that disconnects meanwhile has its queued
        sentences dropped (:class:`_ClientGone`). Raises 503 when the loop stops."""
        try:
            job: Job = self.batcher.submit(sentences, spec)
        except WorkerStopped as exc:
            raise RequestError(503, str(exc), None, {"Retry-After": "1"}) from None
        # one event-loop future settled by whichever comes first, the job (from the inference thread) or the
        # client's disconnect (asyncio.wait over wrap_future's future and the watcher, as before, held the interpreter
        # for about 15 % of the event loop's time per one-sentence request: py-spy --gil on bench/serve_load.py)
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        job.future.add_done_callback(lambda done: _relay_threadsafe(loop, done, answer))
        gone = loop.create_task(_disconnect(request))
        gone.add_done_callback(lambda _: answer.done() or answer.set_exception(_ClientGone()))
        try:
            return await answer
        except _ClientGone:  # the client went away first
            self.metrics.dropped.inc(self.batcher.cancel(job))
            raise
        except WorkerStopped as exc:
            raise RequestError(503, str(exc), None, {"Retry-After": "1"}) from None
        except ElmoError as exc:
            raise RequestError(422, str(exc)) from None
        finally:
            gone.cancel()


def _relay_threadsafe(loop: asyncio.AbstractEventLoop, done, answer: asyncio.Future) -> None:
    """From the inference thread: :func:`_relay` on the event loop, unless it has closed (a request cancelled at
    shutdown whose job finished after the loop ended: nobody waits for it)."""
    try:
        loop.call_soon_threadsafe(_relay, done, answer)
    except RuntimeError:  # "Event loop is closed"
        pass


def _relay(done, answer: asyncio.Future) -> None:
    """On the event loop: a job's settled ``concurrent.futures.Future`` into ``answer`` (unless the client's
    disconnect settled it first)."""
    if answer.done():
        return
    if done.cancelled():
        answer.set_exception(_ClientGone())
    elif (error := done.exception()) is not None:
        answer.set_exception(error)
    else:
        answer.set_result(done.result())


async def _disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has been read: the server's next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


_timeout = getattr(asyncio, "timeout", None)  # Python ≥ 3.11


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, refused with 413 as soon as it is over ``limit`` bytes (by its Content-Length or as it arrives), and
    with 408 when it has not all arrived within ``timeout`` seconds (a stalled client would otherwise hold its slot,
    and a graceful shutdown, for ever). Raises starlette's ``ClientDisconnect`` when the client goes away."""
    length = request.headers.get("content-length")
    too_big = f"the request body is over the limit of {limit} bytes (--payload-limit): split the request"
    if length is not None and length.isdigit() and int(length) > limit:
        raise RequestError(413, too_big)
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, too_big)
            chunks.append(chunk)

    try:
        if _timeout is None:  # Python 3.10
            await asyncio.wait_for(read(), timeout)
        else:  # a timer on this task: no task of its own, as wait_for makes before 3.12
            async with _timeout(timeout):
                await read()
    except asyncio.TimeoutError:
        raise RequestError(
            408, f"the request body did not arrive within {timeout:g} s (--body-timeout)", None, {"Connection": "close"}
        ) from None
    return b"".join(chunks)


def _json(data: object, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json_bytes(data), status_code=status, headers=headers, media_type="application/json")


def _error(exc: RequestError) -> Response:
    return _json(exc.body(), exc.status, exc.headers)


class _Guard:
    """The outer ASGI layer: the API key (401), and each request's route, status and duration into the metrics.

    ``direct`` maps ``(method, path)`` to an endpoint (``async (Request) -> Response``) answered here rather than
    through the FastAPI application, whose routing and middleware (exception telemetry, body limit, exit stack,
    dependency solving) held the interpreter longer than the endpoint itself for a one-sentence ``/embed``
    (py-spy on ``bench/serve_load.py``'s load); the endpoints catch their own refusals, and anything else they
    raise is logged and answered 500 in the error shape."""

    def __init__(self, app, state: ServerState, direct: dict | None = None) -> None:
        self.app, self.state = app, state
        self.direct = dict(direct or {})
        key = state.settings.api_key
        self.expected = key.encode() if key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.expected is not None and scope["path"] not in _OPEN_PATHS and not self._authorised(scope):
                error = RequestError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", None)
                error.headers["WWW-Authenticate"] = "Bearer"
                await _error(error)(scope, receive, send_status)
            elif (endpoint := self.direct.get((scope["method"], scope["path"]))) is not None:
                await self._direct(endpoint, scope, receive, send_status)
            else:
                await self.app(scope, receive, send_status)
        finally:
            self.state.metrics.observe_request(scope["path"], status[0], time.perf_counter() - start)

    @staticmethod
    async def _direct(endpoint, scope, receive, send) -> None:
        try:
            response = await endpoint(Request(scope, receive))
        except Exception:  # a defect: as FastAPI's outermost layer would, log it and answer 500
            logger.exception("%s %s failed", scope["method"], scope["path"])
            response = _error(RequestError(500, f"{scope['method']} {scope['path']}: internal error (logged)", None))
        await response(scope, receive, send)

    def _authorised(self, scope) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = given.strip().partition(b" ")
        # the scheme is case-insensitive (RFC 9110 §11.1: "bearer KEY" is "Bearer KEY")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected)


#: A pre-tokenised ``/embed`` request of at most this many body bytes is checked on the event loop, and an answer of
#: at most this many numbers is built there: for one pooled sentence the two hops to a worker thread and back cost
#: more than the work (docs/explanation/serving-performance.md). Larger ones go to a worker thread, so that the loop
#: stays free for every other request and ``/health``.
INLINE_BODY_BYTES = 16_384
INLINE_ANSWER_VALUES = 16_384


async def _answer(state: ServerState, request: Request, handler) -> Response:
    """Run an embedding route's ``handler(body, size)`` (the parsed JSON and its size in bytes) inside a slot,
    turning refusals into their statuses."""
    try:
        with state.slot():
            raw = await _read_body(request, state.settings.payload_limit, state.settings.body_timeout_s)
            return await handler(parse_json(raw), len(raw))
    except RequestError as exc:
        return _error(exc)
    except (_ClientGone, ClientDisconnect):  # gone while queued, or while sending its body
        return Response(status_code=499)


def _embed_response(state: ServerState, req: EmbedRequest, arrays: list[np.ndarray], npz: bool) -> Response:
    """``/embed``'s answer, built in a worker thread (millions of numbers as JSON take seconds, which would stall
    every other request and ``/health`` on the event loop); the JSON one sentence at a time, so that the loop's
    thread gets the interpreter between them. Raises 422 when the vectors overflow."""
    check_finite(arrays, req.spec)
    if npz:
        return Response(npz_bytes(arrays), media_type=NPZ_TYPE)
    head = {"model": state.model_name, "options": req.spec.settings()}
    items = [
        json_bytes({"index": i, "tokens": s, "shape": list(a.shape), "vectors": np.ascontiguousarray(a)})
        for i, (s, a) in enumerate(zip(req.sentences, arrays))
    ]
    body = json_bytes(head)[:-1] + b',"data":[' + b",".join(items) + b"]}"
    return Response(body, media_type="application/json")


def _embed_route(state: ServerState):
    async def embed(request: Request) -> Response:
        media = negotiate(request.headers.getlist("accept"), EMBED_TYPES)
        if media is None:
            return _error(not_acceptable(request.headers.getlist("accept")))
        npz = media == NPZ_TYPE

        async def handle(body: dict, size: int) -> Response:
            dims = (state.embedder.num_layers, state.embedder.output_dim)
            if size <= INLINE_BODY_BYTES and isinstance(body, dict) and "texts" not in body:
                req = parse_embed(body, state.settings, *dims)
            else:  # texts are tokenised, and large requests checked, off the loop
                req = await asyncio.to_thread(parse_embed, body, state.settings, *dims)
            arrays = await state.run(request, req.sentences, req.spec)
            if sum(a.size for a in arrays) <= INLINE_ANSWER_VALUES:
                return _embed_response(state, req, arrays, npz)
            return await asyncio.to_thread(_embed_response, state, req, arrays, npz)

        return await _answer(state, request, handle)

    return embed


def _openai_route(state: ServerState):
    async def embeddings(request: Request) -> Response:
        async def handle(body: dict, size: int) -> Response:
            parsed = await asyncio.to_thread(
                parse_openai, body, state.settings, state.openai_spec, state.embedder.output_dim
            )
            req, _, fmt = parsed  # the strings tokenised off the event loop
            arrays = await state.run(request, req.sentences, req.spec)
            data = [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": base64_vector(a) if fmt == "base64" else np.ascontiguousarray(a, dtype=np.float32),
                }
                for i, a in enumerate(arrays)
            ]
            n = sum(len(s) for s in req.sentences)
            usage = {"prompt_tokens": n, "total_tokens": n}
            return _json({"object": "list", "data": data, "model": state.model_name, "usage": usage})

        return await _answer(state, request, handle)

    return embeddings


class _QueuedEmbedder:
    """What :func:`~elmokit.analysis.polysemy.occurrence_vectors` needs of an embedder, through the batcher's queue
    (so ``/similar`` shares the process's one inference loop)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.num_layers = state.embedder.num_layers
        self.output_dim = state.embedder.output_dim

    def embed_sentences(self, sentences, batch_size=None, **options):  # noqa: ARG002 (the batcher's budget rules)
        spec = self.state.embedder.output_spec(**options)
        return iter(self.state.batcher.embed_sync(validate_sentences(list(sentences)), spec))


def similar_result(state: ServerState, req: SimilarRequest) -> dict:
    """``/similar``'s answer, as ``elmokit similar --json`` computes it (every layer and the average): the
    occurrences, per layer the cosine matrix (rounded to 6 decimals as the command prints it) and its summary, and
    per layer the 2-D projection :func:`~elmokit.analysis.polysemy.plot_scale` draws (unit vectors, one scale); every
    float as float32 (the answer writes each in its shortest float32 form).

    Raises:
        RequestError: 422 when the word occurs in no sentence, or more than ``max_occurrences`` times."""
    occurrences = find_occurrences(req.sentences, req.word, req.match, req.labels)
    match = req.match if req.match != "auto" else ("span" if is_cjk(req.word) else "token")
    if not occurrences:
        raise RequestError(
            422,
            f"the word {req.word!r} occurs in none of the {len(req.sentences)} sentences (matched as "
            f"{'one whole token' if match == 'token' else 'a run of whole tokens'}; check the spelling, case and "
            "tokenisation)",
            "word",
        )
    if len(occurrences) > state.settings.max_occurrences:  # n² cosines a layer: bound the work and the answer
        raise RequestError(
            422,
            f"the word {req.word!r} occurs {len(occurrences)} times; this server compares at most "
            f"{state.settings.max_occurrences} occurrences (--max-occurrences): send fewer sentences",
            "sentences",
        )
    vectors = occurrence_vectors(_QueuedEmbedder(state), req.sentences, occurrences, context=req.context)
    sims = layer_similarities(vectors)
    n_layers = state.embedder.num_layers
    names = layer_names(n_layers)
    labels = [o.label for o in occurrences] if req.labels is not None else None
    coords, limit = plot_scale(vectors, list(range(n_layers)) + ["average"])
    return {
        "word": req.word,
        "model": state.model_name,
        "match": match,
        "occurrences": [
            {"id": i, "sentence": o.sentence, "start": o.start, "end": o.end, "label": o.label}
            for i, o in enumerate(occurrences)
        ],
        "layer_names": names,  # the layers' order (a JavaScript object puts "1", "2" before "0 (static)")
        "layers": {
            name: {"summary": float32_values(label_similarity(m, labels)), "cosine": np.round(m, 6).astype(np.float32)}
            for name, m in zip(names, sims)
        },
        "projection": {
            "limit": np.float32(limit),
            "layers": {name: np.ascontiguousarray(xy, dtype=np.float32) for name, xy in zip(names, coords)},
        },
    }


def _similar_route(state: ServerState):
    async def similar(request: Request) -> Response:
        async def handle(body: dict, size: int) -> Response:
            req = await asyncio.to_thread(parse_similar, body, state.settings)  # texts tokenised off the event loop
            try:
                return await asyncio.to_thread(lambda: _json(similar_result(state, req)))
            except WorkerStopped as exc:
                raise RequestError(503, str(exc), None, {"Retry-After": "1"}) from None

        return await _answer(state, request, handle)

    return similar


def _read_routes(app, state: ServerState) -> None:
    """The GET routes: /health, /info, /metrics, the page and its examples."""

    @app.get("/health")
    async def health() -> Response:
        if state.batcher.ready.is_set() and state.batcher.alive:
            return _json({"status": "ok"})
        why = "starting" if state.batcher.alive else "the inference worker stopped"
        return _json({"status": why}, 503, {"Retry-After": "1"})

    @app.get("/info")
    async def info() -> Response:
        import elmokit  # lazy: the package's version (elmokit is loaded already)

        embedder = state.embedder
        return _json(
            {
                "model": state.model_name,
                "model_path": str(state.settings.model),
                "fingerprint": state.fingerprint,
                "version": elmokit.__version__,
                "layers": embedder.num_layers,
                "dim": embedder.output_dim,
                "device": str(embedder.device),
                "precision": embedder.precision,
                "batch_invariant": bool(embedder.batch_invariant),
                "openai": {
                    "layers": state.settings.openai_layers,
                    "pool": state.settings.openai_pool,
                    "tokenizer": state.settings.tokenizer,
                    "rule": "each input string is tokenised, embedded, the layers selected, then pooled over its "
                    "real tokens only (no sentence boundaries)",
                },
                "limits": state.settings.limits(),
                "settings": state.settings.public(),
            }
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.scrape(state.batcher.queued), media_type=state.metrics.content_type)

    @app.get("/")
    async def page() -> Response:
        html = importlib.resources.files("elmokit.serving").joinpath("page/index.html").read_bytes()
        return Response(html, media_type="text/html; charset=utf-8")

    @app.get("/examples")
    async def examples() -> Response:
        def pack(rows, word):
            return {"word": word, "sentences": [t for _, t, _ in rows], "labels": [lab for lab, _, _ in rows]}

        return _json({"bank": pack(BANK_SENTENCES, "bank"), "苹果": pack(APPLE_SENTENCES, "苹果")})


def create_app(settings: ServeSettings, embedder: Embedder | None = None):
    """The ASGI application for ``settings`` (its model loaded now unless ``embedder`` is given); its ``state`` is the
    :class:`ServerState`. The inference loop starts with the application (its lifespan) and, at shutdown, finishes
    the work it accepted before it stops. Layers, outside in: CORS (only with ``cors_origins``), the API key and the
    request metrics (and the two embedding routes, answered there), FastAPI's routes.

    Raises the model loaders' errors (naming the model)."""
    embedder = embedder if embedder is not None else load_embedder(settings)
    state = ServerState(settings, embedder)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        state.batcher.start()
        yield
        await asyncio.to_thread(state.batcher.stop)

    app = fastapi.FastAPI(
        title="elmokit", version="1", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json"
    )
    hot = {"/embed": _embed_route(state), "/v1/embeddings": _openai_route(state)}  # answered by _Guard directly
    for path, endpoint in hot.items():
        app.add_api_route(path, endpoint, methods=["POST"])  # listed in /openapi.json as before
    app.add_api_route("/similar", _similar_route(state), methods=["POST"])
    _read_routes(app, state)

    async def not_here(request: Request, exc) -> Response:
        what = "no such route" if exc.status_code == 404 else "not allowed"
        return _error(RequestError(exc.status_code, f"{request.method} {request.url.path}: {what}; {_ROUTES}"))

    app.add_exception_handler(404, not_here)
    app.add_exception_handler(405, not_here)
    outer = _Guard(app, state, {("POST", path): endpoint for path, endpoint in hot.items()})
    if settings.cors_origins:  # outside the key check: preflights pass, and a 401 reaches the page readably
        cors = import_optional("fastapi.middleware.cors", "serve", "elmokit serve (the HTTP server)")
        outer = cors.CORSMiddleware(
            outer,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Accept"],
        )
        outer.state = state
    return outer


def app_from_env():
    """The application for the settings in :data:`~elmokit.serving.settings.SETTINGS_ENV` (each process of
    ``--workers N`` calls it, loading its own model)."""
    return create_app(ServeSettings.from_env())
