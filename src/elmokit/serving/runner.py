"""Running the application under uvicorn: one process, or ``--workers N`` processes sharing the port, each with its
own model; SIGTERM or Ctrl-C stops accepting, answers what was accepted, stops the inference loop and exits 0."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Callable

from elmokit.errors import UsageError, import_optional
from elmokit.serving.settings import ServeSettings

__all__ = ["serve", "bind"]

uvicorn = import_optional("uvicorn", "serve", "elmokit serve (the HTTP server)")
supervisors = import_optional("uvicorn.supervisors", "serve", "elmokit serve (the HTTP server)")


class _Server(uvicorn.Server):
    """uvicorn's server whose stop signal is the expected end: it shuts down gracefully (stops accepting, finishes
    the requests in flight, runs the application's shutdown) and does not raise the signal again afterwards (uvicorn
    re-raises it, which would end the process by the signal or, under ``elmokit``'s handler, with 130)."""

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
        server = _Server(uvicorn.Config(app, **options))
        if announce is not None:
            announce(port)
        server.run(sockets=[sock])
        return 0 if server.started else 1
    settings.to_env()
    config = uvicorn.Config("elmokit.serving.app:app_from_env", factory=True, workers=settings.workers, **options)
    if announce is not None:
        announce(port)
    # each worker runs uvicorn's own server: a SIGTERM from the supervisor shuts it down gracefully, then ends it
    supervisors.Multiprocess(config, sockets=[sock]).run()
    sys.stderr.flush()
    return 0
