"""A bundle's bytes, read safely, and the path to save one to, refused early.

Only regular files are opened (never blocking on a FIFO or reading ``/dev/zero``), read up
to ``MAX_FILE_BYTES`` (opened and counted by ``hangdoc.safefiles``) and, when they are gzip
data, inflated up to ``MAX_JSON_BYTES``. Paths to write to are checked by
``hangdoc.outfiles``. Imports no other file of this package.
"""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

from ..errors import BundleError
from ..filekinds import file_kind
from ..outfiles import Refused, check_target
from ..safefiles import open_to_read, read_at_most

_GZIP_MAGIC = b"\x1f\x8b"

# Size caps. A version 2 bundle of a synthetic 100k-rank job (3 samples, 8 threads a rank)
# is about 150 bytes a rank before gzip and 17 after; a version 1 bundle about 3.4 kB
# before and 116 after. The caps leave room for 100x that and keep a corrupt or hostile
# file from filling the memory: a plain file is read up to MAX_FILE_BYTES, and gzip data is
# inflated incrementally, stopping once the text passes MAX_JSON_BYTES (a 1 MB gzip "bomb"
# of zeros would otherwise inflate to 1 GB).
MAX_FILE_BYTES = 512 * 2**20
MAX_JSON_BYTES = 512 * 2**20
_INFLATE_CHUNK = 4 * 2**20  # the most bytes one step of inflating gives


def check_save_path(path: str | Path) -> None:
    """Refuse, before a capture, a ``--save`` path that ``save_snapshot`` would refuse."""
    try:
        check_target(path)
    except (OSError, ValueError) as err:
        raise _save_error(path, err) from None


def _save_error(path: str | Path, err: Exception) -> BundleError:
    message = f"cannot write snapshot to {path}: {_reason(err)}"
    if isinstance(err, Refused):
        return BundleError(message, help=err.help)
    return BundleError(message, help="Give --save a file path in an existing directory this user can write.")


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n:,} bytes"


def _reason(err: Exception) -> str:
    return (err.strerror if isinstance(err, OSError) else None) or str(err)


def _read_file(path: Path) -> bytes:
    """The bytes of the regular file ``path``, at most ``MAX_FILE_BYTES`` of them.

    Opened non-blocking, so that a FIFO is refused at once instead of waiting for a writer.
    """
    try:
        fd = open_to_read(path)
    except (OSError, ValueError) as err:
        raise BundleError(f"cannot read snapshot {path}: {_reason(err)}") from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            raise BundleError(f"{path} is a directory; pass the snapshot file written by --save")
        if not stat.S_ISREG(mode):
            raise BundleError(f"{path} is {file_kind(mode)}, not a snapshot file; pass the file written by --save")
        raw = read_at_most(fd, MAX_FILE_BYTES)
        if raw is None:
            raise BundleError(f"{path}: larger than {_size(MAX_FILE_BYTES)}, more than any snapshot hangdoc writes")
        return raw
    except OSError as err:
        raise BundleError(f"cannot read snapshot {path}: {_reason(err)}") from None
    finally:
        os.close(fd)


def _gunzip(raw: bytes, path: Path) -> bytes:
    """``raw`` (one or more gzip members) inflated, stopping past ``MAX_JSON_BYTES``."""
    chunks: list[bytes] = []
    total = 0
    data = raw
    while data:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
        tail = data
        try:
            while not inflater.eof and total <= MAX_JSON_BYTES:
                # max_length bounds each step's output; the input it left is unconsumed_tail
                chunk = inflater.decompress(tail, min(_INFLATE_CHUNK, MAX_JSON_BYTES + 1 - total))
                tail = inflater.unconsumed_tail
                if not chunk and not tail:
                    break  # the input ended before the stream did
                chunks.append(chunk)
                total += len(chunk)
        except zlib.error as err:
            raise BundleError(f"{path}: corrupt or truncated gzip data ({err})") from None
        if total > MAX_JSON_BYTES:
            raise BundleError(
                f"{path}: the gzip data inflates to more than {_size(MAX_JSON_BYTES)}, more than any snapshot"
            )
        if not inflater.eof:
            raise BundleError(f"{path}: corrupt or truncated gzip data (the stream ends early)")
        data = inflater.unused_data.lstrip(b"\0")  # zero padding after a member is allowed
        if data and not data.startswith(_GZIP_MAGIC):
            raise BundleError(f"{path}: corrupt gzip data (garbage after the compressed stream)")
    return b"".join(chunks)


def read_input(path: str | Path) -> bytes:
    """The bytes of the regular file ``path``, inflated when they are gzip data (recognised
    by their content), within the caps above: what ``load_snapshot`` reads, and what
    ``hangdoc analyze`` reads before it knows whether the file is a snapshot or a dump.

    Raises ``BundleError`` and nothing else.
    """
    path = Path(path)
    raw = _read_file(path)
    return _gunzip(raw, path) if raw.startswith(_GZIP_MAGIC) else raw
