"""The operator's credential files: the shared token and the mutual-TLS PEM files.

Both sides (``hangdoc agent`` and a coordinator with ``--agents``) read them here, so a
bad file gets the same one-line error on either side, before any socket is opened: a
token file that others can read, is not UTF-8, is empty or short, or is not a regular
file; a certificate, key or CA that OpenSSL cannot load or that do not belong together.
"""

from __future__ import annotations

import os
import ssl
import stat

from ..errors import UsageError

MAX_CREDENTIAL_FILE = 1024 * 1024  # a PEM bundle of many CAs is ~200 KB; a token is 64 bytes
MIN_TOKEN_CHARS = 16


def read_private(path: str, what: str) -> bytes:
    """The bytes of a regular file, without blocking on a FIFO or following a device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path} is not a regular file")
        if st.st_size > MAX_CREDENTIAL_FILE:
            raise UsageError(f"{what} {path} is {st.st_size} bytes; expected at most {MAX_CREDENTIAL_FILE}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_CREDENTIAL_FILE + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_token(path: str) -> str:
    """The token in ``path`` (whitespace stripped); it must be private to its owner."""
    raw = read_private(path, "token file")
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UsageError(f"cannot read token file {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise UsageError(
            f"token file {path} is readable by others (mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`"
        )
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UsageError(f"token file {path} is not UTF-8 text; write one with `openssl rand -hex 32`") from None
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or any(c.isspace() for c in token):
        raise UsageError(
            f"token in {path} must be one word of at least {MIN_TOKEN_CHARS} printable "
            "characters; use `openssl rand -hex 32`"
        )
    return token


def check_tls(cert: str | None, key: str | None, ca: str | None, *, server: bool) -> None:
    """Fail with one line when OpenSSL cannot use these PEM files together."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    for path, what in ((cert, "TLS certificate"), (key, "TLS key"), (ca, "TLS CA")):
        if path:
            read_private(path, what)  # a clear message for a missing or odd file first
    try:
        if cert:
            ctx.load_cert_chain(cert, key, password=lambda: b"")
        if ca:
            ctx.load_verify_locations(cafile=ca)
    except (ssl.SSLError, ValueError) as exc:
        names = ", ".join(p for p in (cert, key, ca) if p)
        reason = getattr(exc, "reason", None) or str(exc)
        raise UsageError(
            f"unusable TLS files ({names}): {reason}; they must be PEM, and the key "
            "must be the certificate's, unencrypted"
        ) from None
