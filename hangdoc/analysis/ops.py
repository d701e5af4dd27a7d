"""Recognise the distributed operation a thread is in, wherever its Python stack ends.

A thread can be blocked in a ``torch.distributed`` call (the innermost c10d frame names
it), in ``Work.wait()`` on a handle issued lines earlier (the innermost *user* frame's line
waits; the source tells which call issued it), in a functional-collective wait (DTensor,
compiled code), in C++ under the autograd engine where DDP's reducer all-reduces (native
frames tell), in rendezvous / process-group creation, or in ``destroy_process_group``.
Recognition reads module paths and torch's own function names, never a training
script's names, and also decides whether the op runs on a cleanup path.

In a job the same few stacks repeat across thousands of ranks: a ``Recogniser``, made once
per analysis, works each distinct thread out once (``thread_key`` says what makes two
threads the same to recognition) and finds source lines through one ``SourceIndex``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from ..memo import once_per_object
from ..model import (
    GIVEN_GROUP,
    GRAPH_CODE,
    WORLD_GROUP,
    DistOp,
    Frame,
    FrameLocals,
    JobSnapshot,
    OpKind,
    Origin,
    Stack,
    ThreadStack,
)
from .host_sync import device_wait
from .source_lines import SourceIndex, enclosing_block, issuing_call, waited_name

COLLECTIVES = frozenset(
    {
        "all_reduce", "all_reduce_coalesced", "all_reduce_multigpu",
        "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_object",
        "all_gather_single", "reduce_scatter_single",  # torch 2.13: FSDP2 calls them directly
        "all_gather_coalesced", "all_gather_multigpu",
        "gather", "gather_object", "scatter", "scatter_object_list",
        "broadcast", "broadcast_object_list", "broadcast_multigpu", "_broadcast_coalesced",
        "reduce", "reduce_multigpu", "reduce_scatter", "reduce_scatter_tensor",
        "_reduce_scatter_base", "reduce_scatter_multigpu",
        "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
    }
)  # fmt: skip
P2P = frozenset(
    {"send", "recv", "isend", "irecv", "send_object_list", "recv_object_list",
     "batch_isend_irecv", "_send", "_recv", "send_tensor", "recv_tensor"}
)  # fmt: skip
INIT = frozenset(
    {
        "init_process_group", "new_group", "_new_group_with_tag", "new_subgroups",
        "new_subgroups_by_enumeration", "_new_process_group_helper", "_store_based_barrier",
        "rendezvous", "_create_c10d_store", "_env_rendezvous_handler",
        "_tcp_rendezvous_handler", "_file_rendezvous_handler", "init_device_mesh",
        "split_group", "_init_process_groups", "_new_group_via_split_group", "shrink_group",
    }
)  # fmt: skip
CLEANUP_OPS = frozenset({"destroy_process_group", "_shutdown_backend", "shutdown", "abort", "_abort_process_group"})
FUNCOL_WAITS = frozenset({"wait_tensor", "wait", "trigger_wait", "_wait_tensor"})
CLEANUP_FUNCTIONS = frozenset(
    {"__exit__", "__aexit__", "__del__", "close", "shutdown", "cleanup", "teardown",
     "finalize", "_exit_function", "_run_finalizers", "destroy", "_shutdown", "_atexit"}
)  # fmt: skip
# c10d reducer / autograd native frames that mean "DDP is all-reducing gradients"
_NATIVE_COLLECTIVE = re.compile(
    r"(c10d::Reducer|c10d::wait_tensor|c10d::ProcessGroup\w*::(allreduce|broadcast|allgather|reduce_scatter|barrier)"
    r"|gloo::(allreduce|broadcast|allgather|barrier)|ncclAllReduce|ncclBroadcast)",
    re.IGNORECASE,
)
_NATIVE_NAMES = {
    "allreduce": "all_reduce", "broadcast": "broadcast", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "barrier": "barrier", "wait_tensor": "wait_tensor",
}  # fmt: skip
# torch's own modules, by their path inside the torch package (``FrameOrigin.module_path``)
_TORCH_DIST = "torch/distributed/"
_FUNCOL = "torch/distributed/_functional_collectives"
_DDP = "torch/nn/parallel/distributed.py"
_C10D = "torch/distributed/distributed_c10d"
_NOT_WORK = frozenset({"os", "proc", "process", "popen", "subprocess", "p"})
_PIPELINING = "torch/distributed/pipelining/"
COMPILED = "compiled graph"
COMPILED_MAYBE = (
    "compiled graph idle in a C++ op, maybe a collective: neither native frames nor the graph's locals say which"
)
# what torch.distributed's own ``x.wait()`` lines wait on that is not a Work handle: the
# rendezvous store, threading events and conditions, processes and threads
_NOT_A_WORK = re.compile(r"store|event|cond|lock|thread|proc|popen|barrier|sem", re.IGNORECASE)
# a literal global peer on the call line, for snapshots taken without locals (``group_dst=``
# is a rank inside the group, not a global rank: never read as one)
_PEER = re.compile(r"\b(dst|src|peer)\s*=\s*(\d+)")
_CALL_WRAPPER = "torch/distributed/c10d_logger.py"
_DEFAULT_GROUP = ("(default)", "None")  # capture.read.pyspy.DEFAULT_GROUP, or group=None given


def _in_torch(frame: Frame) -> bool:
    """PyTorch's own code, by the layout it was loaded from (never a substring of the path:
    a job checked out in ~/nanotorch/ is the user's)."""
    return frame.origin.kind is Origin.TORCH


def user_call_site(frames: tuple[Frame, ...], below: int) -> Frame | None:
    """The innermost Python frame outside torch at or above index ``below``."""
    for frame in reversed(frames[: below + 1]):
        if not frame.native and not _in_torch(frame):
            return frame
    return None


def _python_frames(thread: ThreadStack) -> list[tuple[int, Frame]]:
    return [(i, f) for i, f in enumerate(thread.frames) if not f.native]


def _native_op(thread: ThreadStack) -> str | None:
    for frame in reversed(thread.frames):
        if frame.native:
            m = _NATIVE_COLLECTIVE.search(frame.function)
            if m:
                low = m.group(0).lower()
                for key, name in _NATIVE_NAMES.items():
                    if key in low:
                        return name
                return "all_reduce"  # the reducer's bucket all-reduce
    return None


def _peer(call_site: Frame | None) -> int | None:
    if call_site is None or not call_site.code:
        return None
    m = _PEER.search(call_site.code)
    return int(m.group(2)) if m else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def _call_group(thread: ThreadStack, op_index: int) -> str | None:
    """The process group of the call at ``frames[op_index]``, from its arguments: the call
    wrapper just outside it says whether the caller gave a group (c10d itself replaces
    ``None`` with the default group before blocking); a functional collective names its
    group. None when the snapshot has no arguments for it."""
    own = thread.locals_at(op_index)
    if own is not None and (name := own.get("group_name")) is not None:
        return f"name:{name}"
    for index in range(op_index - 1, -1, -1):
        frame = thread.frames[index]
        if frame.native:
            continue
        if frame.origin.module_path != _CALL_WRAPPER:
            break
        given = thread.locals_at(index)
        if given is not None and (group := given.get("group")) is not None:
            return WORLD_GROUP if group in _DEFAULT_GROUP else GIVEN_GROUP
    return None


def _locals_peer(thread: ThreadStack, op_index: int, group: str | None) -> int | None:
    """The other side of a p2p call, as a global rank, from its arguments: ``dst``/``src``
    are global ranks; ``group_dst``/``group_src`` are ranks inside the group, the same
    numbers only on the default group."""
    found = thread.locals_at(op_index)
    if found is None:
        return None
    for name in ("dst", "src", "global_dst", "global_src", "peer"):
        if (rank := _int(found.get(name))) is not None and rank >= 0:
            return rank
    if group == WORLD_GROUP:
        for name in ("group_dst", "group_src"):
            if (rank := _int(found.get(name))) is not None and rank >= 0:
                return rank
    return None


def init_arguments(thread: ThreadStack) -> tuple[int | None, int | None]:
    """(rank, world size) that the job's code passed to ``init_process_group``, where its
    frame is on the stack with arguments; -1 (torch's "read it from the environment") and
    absent values are None."""
    return init_arguments_at(thread, init_frame(thread.frames))


def init_arguments_at(thread: ThreadStack, index: int | None) -> tuple[int | None, int | None]:
    """``init_arguments`` with its frame's index (``init_frame``) already found."""
    found = thread.locals_at(index) if index is not None else None
    if found is None:
        return None, None
    rank, world = _int(found.get("rank")), _int(found.get("world_size"))
    return (rank if rank is not None and rank >= 0 else None, world if world is not None and world > 0 else None)


def init_frame(frames: Stack) -> int | None:
    """The index of the outermost ``init_process_group`` frame of c10d in ``frames``."""
    for index, frame in enumerate(frames):
        if frame.function == "init_process_group" and frame.origin.under(_C10D):
            return index
    return None


# What recognition reads of a thread: see ``thread_key``.
ThreadKey = tuple[Stack, tuple[FrameLocals, ...], bool, bool]
_BLOCKS = ("finally", "except")
_UNSEEN = object()  # not in a cache yet (None is an answer: no op, no cleanup marker)


def thread_key(thread: ThreadStack) -> ThreadKey:
    """Everything recognition (``recognise``, ``cleanup_marker``) reads of a thread, and
    nothing else: two threads with equal keys get the same answers within one snapshot.

    That is its frames (all their fields: names, files, lines, native or not, the source
    line), the arguments kept of them (``locals``: the group and peer of a call), whether it
    is on CPU (``active``: a busy thread's ``.wait()`` line or DDP frame is not a wait) and
    whether it is the main thread (exit handlers are looked for there), but not its ids,
    its name beyond that, nor ``owns_gil``. Keep it complete: a field that recognition
    starts reading must be added here, or threads that differ only in it would share one
    answer (``test_recognise_once.py`` fails on such a read, and on a new field).

    Of the kept locals, the lock identities of the job's frames (``@NAME``, read by
    ``locks`` only) are left out: they hold per-process addresses, and would make every
    rank's thread a stack of its own.
    """
    return (thread.frames, recognised_locals(thread.locals), thread.active, thread.is_main)


_OBJECT = "@"  # ``locks.OBJECT_PREFIX``: capture's lock identities, not read here


def recognised_locals(found: tuple[FrameLocals, ...]) -> tuple[FrameLocals, ...]:
    """``found`` without the lock identities (``@NAME`` entries), which recognition never
    reads; ``found`` itself when it has none."""
    if not any(name.startswith(_OBJECT) for each in found for name, _ in each.values):
        return found
    kept = []
    for each in found:
        values = tuple((name, value) for name, value in each.values if not name.startswith(_OBJECT))
        if values:
            kept.append(each if len(values) == len(each.values) else FrameLocals(each.index, values))
    return tuple(kept)


class Recogniser:
    """Recognition for one snapshot (``None``: no source lines), each distinct thread
    (``thread_key``) worked out once. ``analyse`` makes one per snapshot and hands it to
    every rank's view, so that the cost grows with the number of distinct stacks rather
    than with ranks x samples x threads."""

    def __init__(self, snapshot: JobSnapshot | None = None) -> None:
        self.snapshot = snapshot
        self.sources = SourceIndex(
            snapshot.sources if snapshot is not None else (),
            whole_stacks=snapshot is None or not snapshot.stacks_may_be_cut,
        )
        self._ops: dict[ThreadKey, DistOp | None] = {}
        self._markers: dict[tuple[ThreadKey, tuple[str, ...]], Frame | None] = {}
        self._device: dict[tuple[ThreadKey, bool], DistOp | None] = {}
        # by the identity of the key's parts, in front of the value lookup above (which
        # hashes whole stacks): snapshots share stack tuples (bundles intern them, a rank
        # keeps its stack across samples). Each entry holds its key, so that no id is reused
        # while this recogniser lives.
        self._by_id: dict[tuple[int, ...], tuple[ThreadKey, DistOp | None]] = {}
        self._op_keys: Callable[[DistOp], tuple[str, tuple[str, ...]]] = once_per_object(_op_key)
        self._python: Callable[[Stack], Stack] = once_per_object(_python_only)
        # the locals part of keys, each value kept once: ranks whose locals differ only in
        # their lock identities' addresses share one object (and the lookup by identity)
        self._interned: dict[tuple[FrameLocals, ...], tuple[FrameLocals, ...]] = {}

    def key(self, thread: ThreadStack) -> ThreadKey:
        """``thread_key(thread)``, with its locals part shared between equal values."""
        key = thread_key(thread)
        if len(key) == 4 and key[1]:
            plain = self._interned.setdefault(key[1], key[1])
            if plain is not key[1]:
                key = (key[0], plain, key[2], key[3])
        return key

    def kept_locals(self, found: tuple[FrameLocals, ...]) -> tuple[FrameLocals, ...]:
        """``recognised_locals(found)``: the locals part of a thread's ``key``, the same
        object for equal values (so that its identity stands for its value)."""
        kept = recognised_locals(found)
        return self._interned.setdefault(kept, kept) if kept else kept

    def recognise(self, thread: ThreadStack) -> DistOp | None:
        """The distributed op ``thread`` is blocked in, or None if it is in none."""
        key = self.key(thread)
        ident = tuple(map(id, key))
        seen = self._by_id.get(ident)
        if seen is not None:
            return seen[1]
        op = self._ops.get(key, _UNSEEN)
        if op is _UNSEEN:
            op = self._ops[key] = _recognise(thread, self.sources)
        assert op is None or isinstance(op, DistOp)
        self._by_id[ident] = (key, op)
        return op

    def device_wait(self, thread: ThreadStack, lines: bool = False) -> DistOp | None:
        """``device.device_wait`` of ``thread`` (a host sync: waiting for device work), with
        its cleanup path like any op's; worked out once per distinct thread."""
        key = (self.key(thread), lines)
        op = self._device.get(key, _UNSEEN)
        if op is _UNSEEN:
            op = device_wait(thread, lines)
            if op is not None:
                op = _with_cleanup(op, thread, self.sources)
            self._device[key] = op
        assert op is None or isinstance(op, DistOp)
        return op

    def cleanup_marker(self, thread: ThreadStack, blocks: tuple[str, ...] = _BLOCKS) -> Frame | None:
        """``cleanup_marker`` of ``thread`` in this snapshot."""
        key = (self.key(thread), blocks)
        marker = self._markers.get(key, _UNSEEN)
        if marker is _UNSEEN:
            marker = self._markers[key] = _cleanup_marker(thread, self.sources, blocks)
        assert marker is None or isinstance(marker, Frame)
        return marker

    def python_frames(self, frames: Stack) -> Stack:
        """``frames`` without its native frames (``frames`` itself when it has none), worked
        out once per stack object, and the same object each time: a stack shared by ranks
        stays shared, and recognised once."""
        return self._python(frames)

    def op_key(self, op: DistOp) -> tuple[str, tuple[str, ...]]:
        """``op.key``, worked out once per op this recogniser returned (the same object for
        every thread with the same key)."""
        return self._op_keys(op)


def _python_only(frames: Stack) -> Stack:
    """``frames`` without its native frames; ``frames`` itself when it has none."""
    python = tuple(f for f in frames if not f.native)
    return frames if len(python) == len(frames) else python


def _op_key(op: DistOp) -> tuple[str, tuple[str, ...]]:
    return op.key


def recognise(thread: ThreadStack, snapshot: JobSnapshot | None = None) -> DistOp | None:
    """The distributed op this thread is blocked in, or None if it is in none. For one
    thread; an analysis of many asks its ``Recogniser``."""
    return Recogniser(snapshot).recognise(thread)


def _recognise(thread: ThreadStack, sources: SourceIndex) -> DistOp | None:
    """``recognise`` itself, uncached: reads of ``thread`` only what ``thread_key`` holds."""
    op = _recognise_call(thread, sources)
    if op is None:
        return None
    return _with_cleanup(replace(op, path=_job_path(thread.frames, op.call_site)), thread, sources)


def _job_path(frames: tuple[Frame, ...], site: Frame | None) -> tuple[Frame, ...]:
    """The frames of the job and its libraries from the outermost to ``site`` (the standard
    library's and torch's own left out): the program point that issued the op."""
    if site is None:
        return ()
    end = max((i for i, f in enumerate(frames) if f is site), default=-1)
    return tuple(f for f in frames[: end + 1] if f.origin.kind in (Origin.USER, Origin.LIBRARY))


def _recognise_call(thread: ThreadStack, sources: SourceIndex) -> DistOp | None:
    frames = thread.frames
    pyframes = _python_frames(thread)
    if not pyframes:
        return None
    # 1. the innermost torch.distributed frame whose function is a known op, unless the
    #    job's own code runs inside it: a callback torch.distributed made (a checkpoint's
    #    storage writer or planner, inside DCP's ``_DistWrapper.all_reduce``) is where the
    #    thread waits, not the op
    job_inside = False
    for idx, frame in reversed(pyframes):
        origin = frame.origin
        if origin.kind in (Origin.USER, Origin.LIBRARY):
            job_inside = True
            continue
        if not origin.under(_TORCH_DIST):
            continue
        path = origin.module_path
        name = frame.function.rsplit(".", 1)[-1]
        kind = _kind_of(name, path)
        if kind is None:
            continue
        if job_inside:
            break
        site = user_call_site(frames, idx)
        if path.startswith(_FUNCOL) and name in FUNCOL_WAITS:
            return DistOp(kind, _funcol_name(frames, idx), site, "functional collective wait")
        kind, name, op_index = _public_op(frames, site, idx, kind, name)
        group = _call_group(thread, op_index)
        peer = None
        if kind is OpKind.P2P:
            peer = _locals_peer(thread, op_index, group) if thread.locals else _peer(site)
        return DistOp(kind, name, site, "c10d call", peer=peer, group=group)
    # 2. a user line that waits on an async handle (Work.wait / Future.wait are C++: no
    #    Python frame of their own, so the innermost frame is the user's ``.wait()`` line)
    _, inner = pyframes[-1]
    waited = waited_name(inner.code)
    if not _in_torch(inner) and waited and waited not in _NOT_WORK and not thread.active:
        issued = issuing_call(sources.lines(inner.filename), inner)
        if issued is not None:
            name, line = issued
            kind = OpKind.P2P if name in P2P else OpKind.COLLECTIVE
            return DistOp(kind, name, inner, f"Work.wait on the {name} issued at line {line}")
        native = _native_op(thread)
        return DistOp(OpKind.COLLECTIVE, native or "wait", inner, "Work.wait (issuing call not in the captured source)")
    # 2b. torch.distributed's own code waiting on handles it issued elsewhere: a pipelining
    #    schedule waits on the Work of its stage's batched send/recv in a helper of its own
    #    (``_wait_batch_p2p``), so no frame names the op
    if (
        _in_torch(inner)
        and inner.origin.under(_TORCH_DIST)
        and waited
        and not thread.active
        and not _NOT_A_WORK.search(waited)
    ):
        site = user_call_site(frames, len(frames) - 1)
        if inner.origin.under(_PIPELINING):
            return DistOp(
                OpKind.P2P, "batch_isend_irecv", site, f"Work.wait in the pipelining schedule ({inner.function})"
            )
        return DistOp(
            OpKind.COLLECTIVE,
            _native_op(thread) or "wait",
            site,
            f"Work.wait in {inner.origin.module_path} ({inner.function})",
        )
    # 2c. a compiled graph (torch.compile, AOT autograd) idle in one of its C++ ops: its
    #    functional collectives run with no torch.distributed frame and no source
    graph = _compiled_graph(thread)
    if graph is not None:
        return graph
    # 3. native frames: DDP reducer / autograd engine all-reducing in C++
    native = _native_op(thread)
    if native is not None:
        site = user_call_site(frames, len(frames) - 1)
        return DistOp(OpKind.COLLECTIVE, native, site, "native frames")
    # 4. no native frames: blocked in DDP's own code (its forward's buffer/parameter sync),
    #    only when nothing but torch runs inside it: a DDP-wrapped forward that blocks in the
    #    job's own module (a lock, a read) is the job's code blocking, not DDP
    for idx, frame in reversed(pyframes):
        if frame.origin.under(_DDP):
            if thread.active:
                break
            return DistOp(
                OpKind.COLLECTIVE,
                "all_reduce",
                user_call_site(frames, idx),
                "DDP forward/backward sync (no native frames)",
            )
        if frame.origin.kind is not Origin.TORCH:
            break
    return None


def _compiled_graph(thread: ThreadStack) -> DistOp | None:
    """The op of a thread idle inside a compiled FX graph's frame (``<eval_with_key>``), with
    only torch's runtime below it: the collective the native frames name (``c10d::``), else
    the graph's last collective node bound (kept by capture as ``graph_op``), else maybe a
    collective: an idle C++ op in a distributed job's graph waits on something, and only
    native frames or the graph's locals say what."""
    if thread.active:
        return None
    frames = thread.frames
    at = next(
        (
            i
            for i in range(len(frames) - 1, -1, -1)
            if not frames[i].native and frames[i].filename.startswith(GRAPH_CODE)
        ),
        None,
    )
    if at is None or any(not f.native and not _in_torch(f) for f in frames[at + 1 :]):
        return None
    site = next(
        (f for f in reversed(frames[:at]) if not f.native and f.origin.kind in (Origin.USER, Origin.LIBRARY)), None
    )
    kept = thread.locals_at(at)
    node = kept.get("graph_op") if kept is not None else None
    native = _native_op(thread)
    if native is not None:
        name = node if node and node != "wait_tensor" else native
        return DistOp(OpKind.COLLECTIVE, name, site, f"{COMPILED} ({frames[at].filename}): native frames")
    if node is not None:
        return DistOp(OpKind.COLLECTIVE, node, site, f"{COMPILED} ({frames[at].filename}): its last collective node")
    return DistOp(OpKind.COLLECTIVE, "compiled graph op", site, COMPILED_MAYBE)


def _public_op(
    frames: tuple[Frame, ...], site: Frame | None, idx: int, kind: OpKind, name: str
) -> tuple[OpKind, str, int]:
    """The outermost known op between the user's call site and ``idx``: the API the user
    called (``recv_object_list``, ``init_process_group``), not the helper that blocks; and
    its frame's index."""
    start = 0
    if site is not None:
        start = max(i for i in range(idx + 1) if frames[i] is site) + 1
    for index in range(start, idx):
        frame = frames[index]
        origin = frame.origin
        if not origin.under(_TORCH_DIST):
            continue
        outer = frame.function.rsplit(".", 1)[-1]
        outer_kind = _kind_of(outer, origin.module_path)
        if outer_kind is not None:
            return outer_kind, outer, index
    return kind, name, idx


def _kind_of(name: str, path: str) -> OpKind | None:
    if name in CLEANUP_OPS and path.startswith(_C10D):
        return OpKind.CLEANUP
    if name in INIT:
        return OpKind.INIT
    if name in P2P:
        return OpKind.P2P
    if name in COLLECTIVES:
        return OpKind.COLLECTIVE
    if path.startswith(_FUNCOL) and (name in FUNCOL_WAITS or name in COLLECTIVES):
        return OpKind.COLLECTIVE
    return None


def _funcol_name(frames: tuple[Frame, ...], idx: int) -> str:
    """For a functional-collective wait, the collective that produced the tensor if visible."""
    for frame in reversed(frames[:idx]):
        if frame.origin.under(_FUNCOL) and frame.function in COLLECTIVES:
            return frame.function
    return "wait_tensor"


def _with_cleanup(op: DistOp, thread: ThreadStack, sources: SourceIndex) -> DistOp:
    marker = _cleanup_marker(thread, sources, _BLOCKS)
    if op.kind is OpKind.CLEANUP and marker is None:
        marker = op.call_site
    if marker is None:
        return op
    return replace(op, in_cleanup=True, cleanup_frame=marker)


def cleanup_marker(
    thread: ThreadStack, snapshot: JobSnapshot | None, blocks: tuple[str, ...] = _BLOCKS
) -> Frame | None:
    """The frame that puts this thread on a cleanup path, or None.

    Cleanup is: a frame of the job or a library in ``__exit__`` called with an exception
    (by its name alone where capture kept no arguments), ``close``/``shutdown``/...;
    such a frame whose current line is inside a ``finally:`` or ``except`` block; the
    standard library's exit-time machinery, and a ``@contextmanager`` exiting with an
    exception (``_stdlib_cleanup``); exit handlers, recognisable because the main script's
    ``<module>`` frame is no longer at the bottom of the main thread's stack (not read of
    stacks a person may have cut: ``JobSnapshot.stacks_may_be_cut``). The standard
    library's own ``__exit__``/``shutdown`` is the normal end of a ``with`` block (a
    ``ThreadPoolExecutor`` joining its workers) as often as cleanup: not by its name alone.
    For one thread; an analysis of many asks its ``Recogniser``.
    """
    return Recogniser(snapshot).cleanup_marker(thread, blocks)


def _cleanup_marker(thread: ThreadStack, sources: SourceIndex, blocks: tuple[str, ...]) -> Frame | None:
    """``cleanup_marker`` itself, uncached: reads of ``thread`` only what ``thread_key`` holds."""
    for index in range(len(thread.frames) - 1, -1, -1):
        frame = thread.frames[index]
        kind = frame.origin.kind
        if kind in (Origin.TORCH, Origin.INTERNAL):
            continue
        if kind is Origin.STDLIB:
            if _stdlib_cleanup(frame):
                return frame
            continue
        name = frame.function.rsplit(".", 1)[-1]
        exception = _exit_exception(thread, index) if name in ("__exit__", "__aexit__") else None
        if exception is not None:
            # what the with-block is doing, where capture kept it: unwinding an error is
            # cleanup; ending normally is the program's own path (a barrier after training)
            if exception != "None":
                return frame
        elif name in CLEANUP_FUNCTIONS:
            return frame
        if frame.line and enclosing_block(sources.lines(frame.filename), frame.line) in blocks:
            return frame
    if thread.is_main and sources.whole_stacks and _is_exit_handler(thread):
        return next((f for f in thread.frames if not f.native), None)
    return None


def _exit_exception(thread: ThreadStack, index: int) -> str | None:
    """The exception (``<TypeName>`` or ``"None"``) the ``__exit__`` at ``frames[index]``
    was called with, when capture kept its arguments."""
    found = thread.locals_at(index)
    return found.get("exception") if found is not None else None


# the standard library's functions that run only while the interpreter exits
_EXIT_TIME = frozenset({"_exit_function", "_run_finalizers", "_shutdown", "_run_exitfuncs"})


def _stdlib_cleanup(frame: Frame) -> bool:
    """A standard-library frame that puts its thread on a cleanup path: exit-time machinery
    (atexit, multiprocessing's finalizers, the interpreter joining threads), or
    ``contextlib``'s ``__exit__`` throwing an exception into a ``@contextmanager`` generator
    (its normal exit is ``next(self.gen)``: the code after ``yield`` is the normal path)."""
    name = frame.function.rsplit(".", 1)[-1]
    if name in _EXIT_TIME:
        return True
    if name in ("__exit__", "__aexit__") and frame.origin.module_path == "contextlib.py":
        return ".throw(" in (frame.code or "") or ".athrow(" in (frame.code or "")
    return False


def exit_frame(thread: ThreadStack) -> Frame | None:
    """The outermost frame of a main thread that runs the interpreter's exit in the standard
    library's exit-time machinery, called from C: ``threading._shutdown`` (joining
    non-daemon threads, ``concurrent.futures``' exit handler), ``atexit``, multiprocessing's
    finalizers. None for any other thread. (A job's own exit handler is read as cleanup by
    ``cleanup_marker``; its outermost frame alone does not tell it from a cut stack.)"""
    if not thread.is_main:
        return None
    outer = next((f for f in thread.frames if not f.native), None)
    if outer is None or outer.origin.kind is not Origin.STDLIB:
        return None
    return outer if outer.function.rsplit(".", 1)[-1] in _EXIT_TIME else None


def _is_exit_handler(thread: ThreadStack) -> bool:
    pyframes = [f for f in thread.frames if not f.native]
    if not pyframes:
        return False
    outer = pyframes[0]
    if outer.function == "<module>":
        return False
    # multiprocessing / runpy / threading bootstraps (standard library, ``python -c``)
    # start with their own frames, not the script's
    if outer.origin.kind in (Origin.STDLIB, Origin.INTERNAL):
        return any(f.function == "_exit_function" for f in pyframes)
    return True
