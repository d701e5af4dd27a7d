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

A pickle is read by ``plainpickle``, which builds only plain containers, strings and
numbers (a dump is data, never code), at most ``MAX_OBJECTS`` of them, and no dict key but a
scalar. Everything is bounded: at most ``MAX_ENTRIES`` entries and ``MAX_GROUPS`` groups are
kept, and a malformed dump is ``FlightRecordInvalid`` with one line saying what is wrong.
Only scalars are taken where the format has scalars (a name, a state, a number): a list or
dict there refuses the dump, and no container of the dump is ever walked whole, copied or
turned into text, so a list the memo shares 2^40 times, or one nested a million deep, costs
what its bytes cost.
"""

from __future__ import annotations

import json
import re
import sys
from itertools import islice
from typing import Any

from ...model import FlightEntry, FlightGroup, FlightRecord
from .plainpickle import NotPlainData, load_plain

MAX_ENTRIES = 20_000  # torch's ring defaults to 2,000 when enabled; a dump beyond this is cut
MAX_GROUPS = 4_096
MAX_RANKS = 1 << 22
MAX_TENSORS = 64  # sizes/dtypes kept per op (a coalesced op can list many)
# objects a dump may build as it loads: torch 2.13's pickle of 2,000 entries (with stacks)
# builds 76,000 (frames and repeated strings are memo references), its JSON 50,000 strings
# and containers, so 20,000 entries fit twice over; an empty dict or a short string costs
# 75 bytes, so 2^21 of them stay near 150 MB
MAX_OBJECTS = 1 << 21
MAX_TEXT = 256  # characters kept of a name, a description
MAX_RANKS_TEXT = 16 * 2**20  # pg_config's "ranks" as text: "[0, 1, ...]" of MAX_RANKS ranks fits
_EMPTY_DUMP = {"version", "pg_config"}  # what a dump of a ring with nothing in it still holds
# "send 0->1", "recv 1<-0" (NCCL's p2p profiling names, ranks of the group); hangdoc's own
# JSON writes "send ->1" (the near side is the dumping rank, which it does not keep)
_P2P_NAME = re.compile(r"^(\w+) (\d*)(->|<-)(\d+)$")


class FlightRecordInvalid(ValueError):
    """The bytes are not a flight recorder dump hangdoc can read."""


def read_flight_record(raw: bytes, source: str = "") -> FlightRecord:
    """The dump in ``raw`` (JSON text or torch's pickle) as a ``FlightRecord``."""
    return read_dump(raw, source, MAX_ENTRIES)


def read_dump(raw: bytes, source: str, keep: int) -> FlightRecord:
    """``read_flight_record`` keeping only the newest ``keep`` entries (``MAX_ENTRIES`` at most)."""
    data = _decode(raw)
    del raw
    if not isinstance(data, dict) or ("entries" not in data and not data.keys() >= _EMPTY_DUMP):
        raise FlightRecordInvalid("not a flight recorder dump: no 'entries'")
    entries = data.get("entries", [])  # torch leaves the key out when it recorded nothing
    if not isinstance(entries, list):
        raise FlightRecordInvalid("'entries' is not a list")
    kept = entries[-max(1, min(keep, MAX_ENTRIES)) :]
    first = kept[0] if kept else None
    try:
        version = _text(data.get("version"), "'version'")[:32]
        groups = _groups(data.get("pg_config"))
    except (TypeError, ValueError) as err:
        raise FlightRecordInvalid(str(err)) from None
    return FlightRecord(
        entries=tuple(_entry(e, i) for i, e in enumerate(kept, len(entries) - len(kept))),
        groups=groups,
        version=version,
        source=source,
        from_start=isinstance(first, dict) and _is_zero(first.get("record_id")) and len(kept) == len(entries),
    )


def _decode(raw: bytes) -> Any:
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        # an upper bound of the containers and strings the text holds, counted before
        # parsing: 16 MiB of "{}," would build 5.6 million dicts (420 MB)
        built = raw.count(b"{") + raw.count(b"[") + raw.count(b'"') // 2
        if built > MAX_OBJECTS:
            raise FlightRecordInvalid(
                f"JSON of {built:,} objects: more than {MAX_OBJECTS:,}, more than any flight recorder dump"
            )
        try:
            return json.loads(raw)
        except RecursionError:
            raise FlightRecordInvalid("not valid JSON: nested too deeply") from None
        except ValueError as err:  # the message names a position, never the content
            raise FlightRecordInvalid(f"not valid JSON: {str(err)[:200]}") from None
    if raw[:1] == b"\x80":  # a pickle's PROTO opcode
        try:
            return load_plain(raw, MAX_OBJECTS)
        except NotPlainData as err:
            raise FlightRecordInvalid(f"not a readable pickle: {err}") from None
    raise FlightRecordInvalid("neither JSON nor a pickle")


def _entry(raw: object, index: int) -> FlightEntry:
    if not isinstance(raw, dict):
        raise FlightRecordInvalid(f"entry {index} is not an object")
    try:
        group = raw.get("process_group")
        pair = group[:2] if isinstance(group, (list, tuple)) else ()
        name = _text(pair[0] if pair else raw.get("pg_id"), "'process_group'")
        desc = _text(pair[1], "'process_group'") if len(pair) > 1 else ""
        p2p = _flag(raw.get("is_p2p"), "'is_p2p'")
        seq = _int(raw.get("p2p_seq_id" if p2p else "collective_seq_id"))
        op, peer = _op_and_peer(_text(raw.get("profiling_name"), "'profiling_name'").rpartition(":")[2])
        return FlightEntry(
            group=name,
            seq=seq,
            op=op,
            peer=peer if p2p else None,
            input_sizes=_sizes(raw.get("input_sizes")),
            input_dtypes=_dtypes(raw.get("input_dtypes")),
            output_sizes=_sizes(raw.get("output_sizes")),
            output_dtypes=_dtypes(raw.get("output_dtypes")),
            p2p=p2p,
            group_desc=desc,
            state=_text(raw.get("state"), "'state'")[:32],  # interned: short
            retired=_flag(raw.get("retired"), "'retired'"),
        )
    except (TypeError, ValueError) as err:
        raise FlightRecordInvalid(f"entry {index}: {err}") from None


def _text(value: object, what: str) -> str:
    """A scalar field as text (at most ``MAX_TEXT`` characters); a container is refused
    unread: ``str()`` of a memo-shared list is unbounded."""
    if value is None:
        return ""
    if isinstance(value, str):
        return sys.intern(value[:MAX_TEXT])  # a group's name repeats in every entry of every rank
    if isinstance(value, (bool, float)) or (isinstance(value, int) and -(1 << 64) < value < 1 << 64):
        return str(value)
    raise TypeError(f"{what} is {_kind(value)}, where a dump holds a string")


def _flag(value: object, what: str) -> bool:
    if value is None:
        return False
    if isinstance(value, (bool, int)):
        return bool(value)
    raise TypeError(f"{what} is {_kind(value)}, where a dump holds true or false")


def _kind(value: object) -> str:
    """What a value is, in words, without looking inside it."""
    if isinstance(value, int):
        return "an integer out of range"
    return f"a {type(value).__name__}"


def _is_zero(value: object) -> bool:
    return type(value) is int and value == 0


def _op_and_peer(name: str) -> tuple[str, int | None]:
    """``("send", 1)`` from ``send 0->1``; ``("all_reduce", None)`` from ``all_reduce``."""
    match = _P2P_NAME.match(name)
    if match is None:
        return sys.intern(name.split(" ", 1)[0][:64]), None
    peer = int(match.group(4))
    return sys.intern(match.group(1)[:64]), peer if peer < MAX_RANKS else None


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"expected an integer, got {_kind(value)}")
    if isinstance(value, str) and len(value) > 20:
        raise ValueError(f"a number of {len(value):,} digits is out of range")
    number = int(value)
    if not 0 <= number < 1 << 62:
        raise ValueError(f"{number} is out of range")
    return number


def _sizes(value: object) -> tuple[tuple[int, ...], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TypeError("sizes are not a list")
    return tuple(tuple(_int(d) for d in shape[:16]) for shape in value[:MAX_TENSORS] if isinstance(shape, list))


def _dtypes(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TypeError("dtypes are not a list")
    return tuple(_text(d, "a dtype")[:32] for d in value[:MAX_TENSORS])  # dtypes are short


def _groups(config: object) -> tuple[FlightGroup, ...]:
    """``pg_config``: {key: {"name", "desc", "ranks": "[0, 1]" or a list}}."""
    if not isinstance(config, dict):
        return ()
    out = []
    for key, value in islice(config.items(), MAX_GROUPS):
        if not isinstance(value, dict):
            continue
        name = _text(value.get("name", key), "a group's 'name'")
        out.append(
            FlightGroup(name=name, desc=_text(value.get("desc"), "a group's 'desc'"), ranks=_ranks(value.get("ranks")))
        )
    return tuple(out)


def _ranks(value: object) -> tuple[int, ...]:
    if isinstance(value, str):
        if len(value) > MAX_RANKS_TEXT:
            return ()
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return ()
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        return ()
    ranks = [v for v in value if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_RANKS]
    return tuple(ranks) if len(ranks) == len(value) else ()


def flight_record_to_json(record: FlightRecord) -> str:
    """``record`` as a dump in torch's own JSON shape, which ``read_flight_record`` reads
    back to the same value (what an agent sends for a rank's dump)."""
    first = 0 if record.from_start else 1
    entries = [
        {
            "process_group": [e.group, e.group_desc],
            "is_p2p": e.p2p,
            "record_id": first + i,
            "p2p_seq_id" if e.p2p else "collective_seq_id": e.seq,
            "profiling_name": _profiling_name(e),
            "input_sizes": [list(s) for s in e.input_sizes],
            "input_dtypes": list(e.input_dtypes),
            "output_sizes": [list(s) for s in e.output_sizes],
            "output_dtypes": list(e.output_dtypes),
            "state": e.state,
            "retired": e.retired,
        }
        for i, e in enumerate(record.entries)
    ]
    groups = {g.name: {"name": g.name, "desc": g.desc, "ranks": list(g.ranks)} for g in record.groups}
    return json.dumps({"version": record.version, "entries": entries, "pg_config": groups})


def _profiling_name(entry: FlightEntry) -> str:
    if entry.peer is None:
        return entry.op
    return f"{entry.op} ->{entry.peer}" if entry.op == "send" else f"{entry.op} <-{entry.peer}"
