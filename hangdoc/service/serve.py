"""``hangdoc server``: the store opened (and migrated), the HTTP side in its threads, the
watch loop in this one, until SIGTERM or SIGINT. Shutdown is graceful: the listening socket
closes first, diagnoses still running get a grace period to be stored, then the store
closes. Every incident is committed before it is announced, so a crash loses none.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import dataclass
from types import FrameType

from .. import __version__
from ..addresses import is_loopback_host
from ..errors import UsageError
from .api import make_http_server
from .loop import HangService, ServiceConfig
from .metrics import ServiceMetrics
from .notify import Notifier
from .store import Store

log = logging.getLogger("hangdoc.server")
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class ServerOptions:
    listen: str
    db: str
    service: ServiceConfig
    token: str | None = None
    tls: tuple[str, str] | None = None  # (certificate, key): HTTPS
    insecure: bool = False
    notify_webhook: str | None = None


def check_listen(options: ServerOptions) -> None:
    """The server holds other people's stacks: off loopback, it needs a token or TLS."""
    host = options.listen.rpartition(":")[0].strip("[]")
    if not is_loopback_host(host) and not (options.token or options.insecure):
        raise UsageError(
            f"refusing to serve incidents on {options.listen} without a token: give --token-file "
            "(and --tls-cert/--tls-key for HTTPS), or --insecure on a trusted network"
        )


def run_server(options: ServerOptions, ready: threading.Event | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s hangdoc-server %(message)s")
    check_listen(options)
    store = Store.open(options.db)
    notifier = None
    try:
        metrics = ServiceMetrics(options.service.stale_after)
        if options.notify_webhook:
            notifier = Notifier(options.notify_webhook, on_result=metrics.notified)
        service = HangService(options.service, store, notifier, metrics=metrics)
        http = make_http_server(options.listen, service, options.token, options.tls)
        port = http.server_address[1]
        threading.Thread(target=http.serve_forever, name="hangdoc-http", daemon=True).start()
        scheme = "https" if options.tls else "http"
        log.info(
            "hangdoc server %s on %s://%s (port %d), store %s",
            __version__,
            scheme,
            options.listen,
            port,
            _shown(options.db),
        )
        print(f"hangdoc server listening on port {port}", file=sys.stderr, flush=True)
        _stop_on_signals(service)
        if ready is not None:
            ready.set()
        service.run()
        log.info("shutting down")
        http.shutdown()
        http.server_close()
        service.stop(STOP_GRACE_S)
    finally:
        if notifier is not None:
            notifier.close(5.0)
        store.close()
    return 0


def _shown(db: str) -> str:
    """The store as a log may show it: a URL without its password."""
    if "://" not in db or "@" not in db:
        return db
    scheme, _, rest = db.partition("://")
    creds, _, where = rest.rpartition("@")
    return f"{scheme}://{creds.partition(':')[0]}@{where}"


def _stop_on_signals(service: HangService) -> None:
    def first(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping (again to stop at once)", signal.Signals(signum).name)
        service.request_stop()
        for each in (signal.SIGTERM, signal.SIGINT):
            signal.signal(each, signal.SIG_DFL)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, first)
