"""A rank's flight recorder dump, read into a ``FlightRecord``.

torch records each process group's recent collectives and p2p ops when the job runs with
``TORCH_FR_BUFFER_SIZE`` (``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.6). A dump is what
``torch._C._distributed_c10d._dump_fr_trace_json()`` returns (JSON) or what torch writes to
``TORCH_FR_DUMP_TEMP_FILE<rank>`` (a pickle of the same dict). The keys read here are the
ones torch's own analyzer reads (``torch/distributed/flight_recorder``): ``version``,
``pg_config`` (each group's name, description and member ranks), and ``entries`` (per op:
``process_group`` as (name, description), ``collective_seq_id``/``p2p_seq_id``,
``is_p2p``, ``profiling_name`` such as ``nccl:all_reduce``, sizes, dtypes, ``state``,
``retired``, ``record_id``).

A p2p op's peer is read from its profiling name where the backend writes it there: NCCL
names a send ``nccl:send 0->1`` and a receive ``nccl:recv 1<-0``, in ranks of the group;
the peer is the number on the far side of the arrow. gloo (torch 2.13) records no p2p op
at all: send, recv, isend/irecv and ``batch_isend_irecv`` leave no entry, only a gap in
the group's ``op_id`` before its next collective. ``record_id`` numbers every op the
process recorded, from 0: a dump whose oldest entry is record 0 lost nothing
(``FlightRecord.from_start``).

A pickle is read with an unpickler that builds only plain containers, strings and numbers:
a dump is data, never code. Everything is bounded: at most ``MAX_ENTRIES`` entries and
``MAX_GROUPS`` groups are kept, and a malformed dump is ``FlightRecordInvalid`` with one
line saying what is wrong.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections.abc import Mapping
from typing import Any

from ..model import FlightEntry, FlightGroup, FlightRecord

MAX_ENTRIES = 20_000  # torch's ring defaults to 2,000 when enabled; a dump beyond this is cut
MAX_GROUPS = 4_096
MAX_RANKS = 1 << 22
MAX_TENSORS = 64  # sizes/dtypes kept per op (a coalesced op can list many)
_EMPTY_DUMP = {"version", "pg_config"}  # what a dump of a ring with nothing in it still holds
_SAFE_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "str", "bytes", "int", "float", "bool"}
# "send 0->1", "recv 1<-0" (NCCL's p2p profiling names, ranks of the group); hangdoc's own
# JSON writes "send ->1" (the near side is the dumping rank, which it does not keep)
_P2P_NAME = re.compile(r"^(\w+) (\d*)(->|<-)(\d+)$")


class FlightRecordInvalid(ValueError):
    """The bytes are not a flight recorder dump hangdoc can read."""


def read_flight_record(raw: bytes, source: str = "") -> FlightRecord:
    """The dump in ``raw`` (JSON text or torch's pickle) as a ``FlightRecord``."""
    data = _decode(raw)
    if not isinstance(data, Mapping) or ("entries" not in data and not _EMPTY_DUMP <= data.keys()):
        raise FlightRecordInvalid("not a flight recorder dump: no 'entries'")
    entries = data.get("entries", [])  # torch leaves the key out when it recorded nothing
    if not isinstance(entries, list):
        raise FlightRecordInvalid("'entries' is not a list")
    kept = entries[-MAX_ENTRIES:]
    first = kept[0] if kept else None
    return FlightRecord(
        entries=tuple(_entry(e, i) for i, e in enumerate(kept)),
        groups=_groups(data.get("pg_config")),
        version=str(data.get("version", ""))[:32],
        source=source,
        from_start=isinstance(first, Mapping) and _is_zero(first.get("record_id")) and len(kept) == len(entries),
    )


def _decode(raw: bytes) -> Any:
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise FlightRecordInvalid(f"not valid JSON: {err}") from None
    if raw[:1] == b"\x80":  # a pickle's PROTO opcode
        try:
            return _PlainUnpickler(io.BytesIO(raw)).load()
        except FlightRecordInvalid:
            raise
        except Exception as err:  # noqa: BLE001 - any way a pickle can be broken
            raise FlightRecordInvalid(f"not a readable pickle: {type(err).__name__}: {err}") from None
    raise FlightRecordInvalid("neither JSON nor a pickle")


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain data only: any class or function named in the stream is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        raise FlightRecordInvalid(f"the pickle names {module}.{name}: a dump holds plain data only")


def _entry(raw: object, index: int) -> FlightEntry:
    if not isinstance(raw, Mapping):
        raise FlightRecordInvalid(f"entry {index} is not an object")
    try:
        group = raw.get("process_group")
        pair = list(group) if isinstance(group, (list, tuple)) else []
        name = str(pair[0]) if pair else str(raw.get("pg_id", ""))
        desc = str(pair[1]) if len(pair) > 1 else ""
        p2p = bool(raw.get("is_p2p", False))
        seq = _int(raw.get("p2p_seq_id" if p2p else "collective_seq_id"))
        op, peer = _op_and_peer(str(raw.get("profiling_name", "")).rpartition(":")[2])
        return FlightEntry(
            group=name[:256],
            seq=seq,
            op=op,
            peer=peer if p2p else None,
            input_sizes=_sizes(raw.get("input_sizes")),
            input_dtypes=_dtypes(raw.get("input_dtypes")),
            output_sizes=_sizes(raw.get("output_sizes")),
            output_dtypes=_dtypes(raw.get("output_dtypes")),
            p2p=p2p,
            group_desc=desc[:256],
            state=str(raw.get("state", ""))[:32],
            retired=bool(raw.get("retired", False)),
        )
    except (TypeError, ValueError) as err:
        raise FlightRecordInvalid(f"entry {index}: {err}") from None


def _is_zero(value: object) -> bool:
    return type(value) is int and value == 0


def _op_and_peer(name: str) -> tuple[str, int | None]:
    """``("send", 1)`` from ``send 0->1``; ``("all_reduce", None)`` from ``all_reduce``."""
    match = _P2P_NAME.match(name)
    if match is None:
        return name.split(" ", 1)[0][:64], None
    peer = int(match.group(4))
    return match.group(1)[:64], peer if peer < MAX_RANKS else None


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    number = int(value)
    if not 0 <= number < 1 << 62:
        raise ValueError(f"{number} is out of range")
    return number


def _sizes(value: object) -> tuple[tuple[int, ...], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TypeError("sizes are not a list")
    return tuple(tuple(_int(d) for d in shape[:16]) for shape in value[:MAX_TENSORS]
                 if isinstance(shape, list))


def _dtypes(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TypeError("dtypes are not a list")
    return tuple(str(d)[:32] for d in value[:MAX_TENSORS])


def _groups(config: object) -> tuple[FlightGroup, ...]:
    """``pg_config``: {key: {"name", "desc", "ranks": "[0, 1]" or a list}}."""
    if not isinstance(config, Mapping):
        return ()
    out = []
    for key, value in list(config.items())[:MAX_GROUPS]:
        if not isinstance(value, Mapping):
            continue
        name = str(value.get("name", key))
        out.append(FlightGroup(name=name[:256], desc=str(value.get("desc", ""))[:256],
                               ranks=_ranks(value.get("ranks"))))
    return tuple(out)


def _ranks(value: object) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    if not isinstance(value, list):
        return ()
    ranks = [v for v in value if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_RANKS]
    return tuple(ranks) if len(ranks) == len(value) else ()


def flight_record_to_json(record: FlightRecord) -> str:
    """``record`` as a dump in torch's own JSON shape, which ``read_flight_record`` reads
    back to the same value (what an agent sends for a rank's dump)."""
    first = 0 if record.from_start else 1
    entries = [{
        "process_group": [e.group, e.group_desc], "is_p2p": e.p2p, "record_id": first + i,
        "p2p_seq_id" if e.p2p else "collective_seq_id": e.seq, "profiling_name": _profiling_name(e),
        "input_sizes": [list(s) for s in e.input_sizes], "input_dtypes": list(e.input_dtypes),
        "output_sizes": [list(s) for s in e.output_sizes], "output_dtypes": list(e.output_dtypes),
        "state": e.state, "retired": e.retired,
    } for i, e in enumerate(record.entries)]
    groups = {g.name: {"name": g.name, "desc": g.desc, "ranks": list(g.ranks)} for g in record.groups}
    return json.dumps({"version": record.version, "entries": entries, "pg_config": groups})


def _profiling_name(entry: FlightEntry) -> str:
    if entry.peer is None:
        return entry.op
    return f"{entry.op} ->{entry.peer}" if entry.op == "send" else f"{entry.op} <-{entry.peer}"
