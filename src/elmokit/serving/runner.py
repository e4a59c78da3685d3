"""Running the application under uvicorn: one process, or ``--workers N`` processes sharing the port, each with its
own model; SIGTERM or Ctrl-C stops accepting, answers what was accepted, gives the clients ``--shutdown-timeout``
seconds to read their answers (then closes the connections still open), stops the inference loop and exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from elmokit.errors import UsageError, import_optional
from elmokit.serving.settings import ServeSettings

__all__ = ["serve", "bind"]

uvicorn = import_optional("uvicorn", "serve", "elmokit serve (the HTTP server)")
supervisors = import_optional("uvicorn.supervisors", "serve", "elmokit serve (the HTTP server)")
multiprocess = import_optional("uvicorn.supervisors.multiprocess", "serve", "elmokit serve (the HTTP server)")

logger = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server whose stop signal is the expected end: it shuts down gracefully and within a bound, and does
    not raise the signal again afterwards (uvicorn re-raises it, which would end the process by the signal or, under
    ``elmokit``'s handler, with 130).

    The shutdown: stop accepting, close the idle connections, wait until every accepted request has been answered
    (each is bounded: its body by ``--body-timeout``, its work by the model), then give the clients
    ``shutdown_timeout`` seconds to read their answers; the connections still open then are closed (a client that
    never reads would otherwise hold the process for as long as it lives: uvicorn waits for every connection), and
    the application's shutdown runs (the inference loop stops)."""

    def __init__(self, config, shutdown_timeout: float = 5.0) -> None:
        super().__init__(config)
        self.shutdown_timeout = shutdown_timeout

    async def _wait_tasks_to_complete(self) -> None:
        """uvicorn's wait at shutdown (after it stopped accepting and closed the idle connections), bounded."""
        state = self.server_state
        waited = False
        while any(_unanswered(c) for c in list(state.connections)) and not self.force_exit:
            if not waited:
                logger.info("answering the %d accepted request(s)", sum(_unanswered(c) for c in state.connections))
                waited = True
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + self.shutdown_timeout
        while (state.connections or state.tasks) and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stalled = list(state.connections)
        if stalled:
            logger.warning(
                "closing %d connection(s) whose client did not read its answer within %g s (--shutdown-timeout)",
                len(stalled),
                self.shutdown_timeout,
            )
            for connection in stalled:
                connection.transport.abort()  # close() would wait to send the unread bytes: for ever
        deadline = time.monotonic() + 1.0  # a send on a closed connection returns at once: the tasks end
        while state.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for task in list(state.tasks):
            task.cancel(msg="the server is shutting down")
        for server in self.servers:
            await server.wait_closed()

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _unanswered(connection) -> bool:
    """Whether ``connection`` (a uvicorn HTTP protocol) holds a request whose whole answer the application has not
    yet handed over (its body still arriving, its sentences queued, its answer being built)."""
    cycle = getattr(connection, "cycle", None)
    return cycle is not None and not cycle.response_complete


class _WorkerProcess(multiprocess.Process):
    """A ``--workers N`` process of uvicorn's supervisor that runs :class:`_Server` (the bounded shutdown) with the
    settings' ``shutdown_timeout_s`` (read in the worker, from the environment the settings travel in)."""

    @property
    def server(self):
        if self._server is None:
            self._server = _Server(self.config, ServeSettings.from_env().shutdown_timeout_s)
        return self._server


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free port). Raises :class:`UsageError` naming the address
    when it cannot be bound (in use, not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port or --host)"
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(
    settings: ServeSettings,
    sock: socket.socket,
    *,
    app_factory: Callable | None = None,
    announce: Callable | None = None,
) -> int:
    """Serve on ``sock`` until SIGTERM/SIGINT; returns 0 after a graceful stop (1 when the application failed to
    start). One process builds its application with ``app_factory`` (default: :func:`~elmokit.serving.app.create_app`
    of ``settings``, loading the model); ``--workers N`` puts the settings in the environment and starts N processes
    (spawned), each building its own. ``announce(port)`` is called once listening."""
    from elmokit.serving import app as app_module  # lazy: loads FastAPI only when serving

    options = dict(log_level="info", access_log=False, lifespan="on", timeout_graceful_shutdown=None)
    port = sock.getsockname()[1]
    if settings.workers == 1:
        app = (app_factory or (lambda: app_module.create_app(settings)))()
        server = _Server(uvicorn.Config(app, **options), settings.shutdown_timeout_s)
        if announce is not None:
            announce(port)
        server.run(sockets=[sock])
        return 0 if server.started else 1
    settings.to_env()
    config = uvicorn.Config("elmokit.serving.app:app_from_env", factory=True, workers=settings.workers, **options)
    if announce is not None:
        announce(port)
    # each worker runs a _Server: a SIGTERM from the supervisor shuts it down gracefully and within the bound (the
    # supervisor makes its processes by the name Process of its module, which has no other hook)
    made_by, multiprocess.Process = multiprocess.Process, _WorkerProcess
    try:
        supervisors.Multiprocess(config, sockets=[sock]).run()
    finally:
        multiprocess.Process = made_by
    sys.stderr.flush()
    return 0
