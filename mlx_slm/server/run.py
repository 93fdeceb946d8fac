"""Running the app: binding the socket first (a clear error, exit 2), uvicorn, and SIGTERM
as a drain (new requests 503, accepted ones finished within --drain-timeout, exit 0)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
from typing import Any

from ..ground.errors import UserError
from ..ground.notices import notice
from ..service import Service
from .app import create_app


def bind_socket(host: str, port: int) -> Any:
    """The listening socket, bound before anything starts (as uvicorn would bind it), so that a
    port in use or an address that is not ours is one `UserError` line (exit 2), not uvicorn's
    log and exit 3 after the model thread has started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: not SO_REUSEPORT
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            why = "the port is in use by another process (find it with `ss -ltnp`): stop it, or choose another --port"
        elif e.errno == errno.EACCES:
            why = "permission denied (ports under 1024 need privileges): choose a port of 1024 or more"
        elif isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
            why = "that address is not one of this machine's: use 127.0.0.1, 0.0.0.0 or an address it has"
        else:
            why = f"{e.strerror or e}: check --host and --port"
        raise UserError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def run_server(
    service: Service, host: str = "127.0.0.1", port: int = 8080, log_level: str = "warning", sock: Any = None
) -> int:
    """Serve until SIGINT, or SIGTERM then drain; returns the exit status (0 after a drain).

    `sock`: a socket from `bind_socket` (else one is bound here, before the worker starts)."""
    import uvicorn  # lazy: uvicorn is the serve extra's

    if sock is None:
        sock = bind_socket(host, port)
    app = create_app(service)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5, lifespan="on", access_log=False
    )
    server = _draining_server(config, service)
    failed: list[str] = []

    def fatal(msg: str) -> None:
        failed.append(msg)
        server.should_exit = True

    service.on_fatal = fatal
    server.run(sockets=[sock])
    if not service.stop():  # the lifespan stopped it already, unless uvicorn was forced down
        _exit_now(70 if failed else 0, failed[0] if failed else "the model worker did not stop")
    if failed:
        raise RuntimeError(failed[0])
    return 0


def _exit_now(status: int, why: str) -> None:
    """Leave without the interpreter's shutdown: a worker thread still inside MLX then makes
    the process abort (SIGABRT, "terminate called without an active exception")."""
    notice(f"mlx-slm: {why}; exiting without waiting for it")
    sys.stdout.flush()
    os._exit(status)


def _draining_server(config: Any, service: Service) -> Any:
    """uvicorn's server with SIGTERM as a drain: 503 to new requests, accepted ones finished
    within the drain timeout, then a normal exit (status 0: the signal is not re-raised).
    A second SIGTERM, or SIGINT, is uvicorn's own shutdown."""
    import uvicorn  # lazy: uvicorn is the serve extra's

    class DrainingServer(uvicorn.Server):
        def __init__(self) -> None:
            super().__init__(config)
            self._drain_started = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and not self._drain_started:
                self._drain_started = True
                service.begin_drain()
                threading.Thread(target=self._drain, name="mlx-slm-drain", daemon=True).start()
                return
            super().handle_exit(sig, frame)

        def _drain(self) -> None:
            # The queue is answered `Aborted` at the drain timeout; the micro-batch running then
            # finishes for whoever waits for it (each request stops waiting at its own timeout),
            # so every connection is answered before uvicorn closes. Then the lifespan stops the
            # worker at its next batch boundary and joins it (`Service.stop`): no thread is left
            # inside MLX when the interpreter exits (that aborted the process, exit 134).
            if not service.wait_idle(service.opts.drain_timeout_s):
                service.abort_pending()
                service.wait_idle(service.opts.request_timeout_s)
            self.should_exit = True

    return DrainingServer()
