"""The one data model: what discovery finds, what capture records, what analysis concludes.

Every step of the pipeline (discover -> capture -> merge -> analyse -> report) takes and
returns these frozen, hashable values; the gRPC messages in ``proto/`` mirror them and the
bundle format (``hangdoc.bundle``) serialises them. Stacks are stored *outermost frame
first* (the opposite of py-spy's output order) so that a stack is a path from the root of
the merged call tree (``CallTree``: built by ``hangdoc.analysis.merge``, read by every
reporter). This module imports nothing else of hangdoc.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

# The largest rank count any value may claim (a world size, a rank number), wherever it
# comes from: a process's environment, an agent's answer, a saved snapshot. The largest
# trainings run about 10^5 ranks; 2**20 lets a million-rank job in (the synthetic 1M-rank
# bundle: analyze --json 45 s, 3.85 GB). Analysis still lists every expected rank: a
# snapshot of one rank claiming this world size takes 6.8 s and 1.05 GB to analyse (--json;
# the terminal report 3.3 s and 450 MB), so the bound stays here until rank sets are compact.
MAX_WORLD_SIZE = 2**20
PID_MIN, PID_MAX = 1, 2**22  # Linux: pid_max is at most 2**22 (PID_MAX_LIMIT)


def counted(count: int, one: str, many: str | None = None) -> str:
    """``1 rank``, ``4 ranks``, ``1,024 processes`` (``many``: the plural, where it is not
    ``one`` + s): a count and its noun in the right number, for every floor's words. Here,
    not with the reporters' words, because this module imports no other of hangdoc and
    its own ``describe`` methods count too."""
    return f"{count:,} {one if count == 1 else many or one + 's'}"


class Origin(enum.Enum):
    """Where a frame's code comes from, by the layout of the installation it was loaded from."""

    USER = "user"  # the job's own code: anywhere outside an installation's library dirs
    TORCH = "torch"  # PyTorch itself
    LIBRARY = "library"  # another installed package (Lightning, accelerate, DeepSpeed, numpy, ...)
    STDLIB = "stdlib"  # the interpreter's standard library
    INTERNAL = "internal"  # no file: <frozen ...>, <string>, native code


@dataclass(frozen=True, slots=True)
class FrameOrigin:
    """A frame's ``Origin``, the top-level package it belongs to (``torch``, ``lightning``;
    empty for user code and the standard library), and its path inside that package's
    installation dir (``torch/distributed/distributed_c10d.py``; the whole path for user code)."""

    kind: Origin
    package: str = ""
    module_path: str = ""

    def under(self, *prefixes: str) -> bool:
        """A torch frame whose module path starts with one of ``prefixes``."""
        return self.kind is Origin.TORCH and self.module_path.startswith(prefixes)


_NO_FILE = FrameOrigin(Origin.INTERNAL)

# Where an installation keeps packages and its standard library. A path component, never a
# substring: a checkout in ~/nanotorch/ or lightning/pytorch/ is not torch.
_PACKAGE_DIRS = frozenset({"site-packages", "dist-packages"})
_STDLIB_DIR = re.compile(r"python3\.\d+t?")  # lib/python3.11/, lib/python3.13t/
# torch run from a source checkout (``pip install -e``) has no site-packages above it: its
# own top-level modules say it is torch.
_TORCH_TOP = frozenset(
    {
        "distributed",
        "nn",
        "autograd",
        "multiprocessing",
        "utils",
        "cuda",
        "optim",
        "amp",
        "fx",
        "futures",
        "jit",
        "testing",
        "export",
        "compiler",
        "accelerator",
        "cpu",
        "backends",
        "__init__.py",
        "functional.py",
        "serialization.py",
        "overrides.py",
        "random.py",
    }
)


# the file name torch.fx gives the code it generates for a compiled graph (torch.compile,
# AOT autograd): ``<eval_with_key>.3``
GRAPH_CODE = "<eval_with_key>"


@functools.lru_cache(maxsize=1 << 16)
def frame_origin(filename: str) -> FrameOrigin:
    """The origin of code in ``filename``, from the path's own layout (see ``Origin``)."""
    if not filename or filename.startswith("<"):
        return _NO_FILE
    parts = [p for p in filename.replace("\\", "/").split("/") if p]
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in _PACKAGE_DIRS:
            package = parts[i + 1].split(".")[0]
            kind = Origin.TORCH if package == "torch" else Origin.LIBRARY
            return FrameOrigin(kind, package, "/".join(parts[i + 1 :]))
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "torch" and (parts[i + 1] in _TORCH_TOP or parts[i + 1].startswith("_")):
            return FrameOrigin(Origin.TORCH, "torch", "/".join(parts[i:]))
    for i in range(len(parts) - 2, 0, -1):
        if parts[i - 1] in ("lib", "lib64") and _STDLIB_DIR.fullmatch(parts[i]):
            return FrameOrigin(Origin.STDLIB, "", "/".join(parts[i + 1 :]))
    return FrameOrigin(Origin.USER, "", filename)


@functools.lru_cache(maxsize=1 << 16)
def short_filename(filename: str) -> str:
    """``Frame.short_filename`` of a frame in ``filename`` (a job quotes its few files often)."""
    for marker in ("site-packages/", "dist-packages/", "/lib/python3"):
        idx = filename.rfind(marker)
        if idx >= 0:
            tail = filename[idx + len(marker) :]
            if marker == "/lib/python3":
                tail = tail.split("/", 1)[-1]
            return tail
    return filename.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a thread's stack. ``line`` is None for native frames without line info."""

    function: str
    filename: str
    line: int | None = None
    native: bool = False
    code: str | None = None  # the source line, read on the node at capture time

    @property
    def origin(self) -> FrameOrigin:
        """Where this frame's code comes from (native frames: ``Origin.INTERNAL``)."""
        return _NO_FILE if self.native else frame_origin(self.filename)

    @property
    def short_filename(self) -> str:
        """The path from the package root (``torch/distributed/x.py``) or the basename."""
        return short_filename(self.filename)

    @property
    def location(self) -> str:
        """``file.py:88`` as quoted in evidence lines."""
        return f"{self.short_filename}:{self.line}" if self.line else self.short_filename

    def __str__(self) -> str:
        return f"{self.function} ({self.location})"


Stack = tuple[Frame, ...]


def tree_frames(frames: Stack) -> Stack:
    """The stack as merged across ranks: unsymbolised native frames (bare addresses, which
    differ per process under ASLR) are left out so identical stacks stay identical."""
    return tuple(f for f in frames if not (f.native and f.function.startswith("0x")))


@dataclass(frozen=True, slots=True)
class FrameLocals:
    """Selected arguments of one frame of torch.distributed, as ``py-spy --locals`` showed
    them and capture cleaned them on the node (``hangdoc.capture.read.pyspy``): numbers, None,
    booleans and bare type names (``<ProcessGroup>``), never a string the job holds."""

    index: int  # the frame's position in ``ThreadStack.frames`` (outermost first)
    values: tuple[tuple[str, str], ...]  # (argument name, value), in the frame's order

    def get(self, name: str) -> str | None:
        for key, value in self.values:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread as py-spy saw it in one sample."""

    thread_id: int
    name: str | None
    frames: Stack  # outermost first
    native_id: int | None = None
    active: bool = False  # running (on CPU) rather than idle/waiting
    owns_gil: bool = False
    # the kept arguments of torch.distributed frames (empty when captured without locals)
    locals: tuple[FrameLocals, ...] = ()

    def locals_at(self, index: int) -> FrameLocals | None:
        """The kept arguments of ``frames[index]``, if any were captured."""
        for found in self.locals:
            if found.index == index:
                return found
        return None

    @property
    def is_main(self) -> bool:
        return self.name == "MainThread"

    @property
    def innermost(self) -> Frame | None:
        return self.frames[-1] if self.frames else None

    @property
    def innermost_python(self) -> Frame | None:
        """The innermost frame that is Python code (native frames skipped)."""
        for frame in reversed(self.frames):
            if not frame.native:
                return frame
        return None


_NATIVE = attrgetter("native")
_FRAMES = attrgetter("frames")

# psutil's names for a process that is paused: by SIGSTOP, or by a tracer (a debugger)
STOPPED_STATUSES = ("stopped", "tracing-stop")


@dataclass(frozen=True, slots=True)
class ThreadCounters:
    """Kernel-side counters of one thread (``/proc/PID/task/TID``): progress is judged per
    thread, so that a busy side thread neither hides a hang nor fakes progress."""

    native_id: int  # the kernel's thread id (py-spy's ``ThreadStack.native_id``)
    cpu_seconds: float  # user + system
    ctx_switches: int | None = None  # voluntary + involuntary
    read_chars: int | None = None  # /proc/PID/task/TID/io rchar
    write_chars: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessState:
    """Kernel-side counters of one process at one instant, used to decide progress."""

    status: str  # psutil status: running, sleeping, disk-sleep, stopped, zombie, ...
    cpu_seconds: float  # user + system, all threads
    num_threads: int
    read_chars: int | None = None  # /proc/PID/io rchar (includes socket reads)
    write_chars: int | None = None  # /proc/PID/io wchar
    ctx_switches: int | None = None  # voluntary + involuntary, of the main thread
    rss_bytes: int | None = None
    threads: tuple[ThreadCounters, ...] = ()  # per thread, where /proc/PID/task was readable

    def thread(self, native_id: int | None) -> ThreadCounters | None:
        for counters in self.threads:
            if counters.native_id == native_id:
                return counters
        return None


class CaptureErrorKind(enum.Enum):
    """Why a sample of a process has no stacks."""

    PROCESS_GONE = "process_gone"
    """The process exited between discovery and sampling."""
    PTRACE_DENIED = "ptrace_denied"
    """The kernel refused to let py-spy read the process (ptrace_scope, missing CAP_SYS_PTRACE)."""
    NOT_PYTHON = "not_python"
    """The process has no Python interpreter py-spy can find."""
    TIMEOUT = "timeout"
    """py-spy did not answer within the sample deadline."""
    PYSPY_MISSING = "pyspy_missing"
    """No py-spy executable was found."""
    PYSPY_FAILED = "pyspy_failed"
    """py-spy failed for another reason; ``message`` has its words."""


@dataclass(frozen=True, slots=True)
class CaptureError:
    kind: CaptureErrorKind
    message: str


MAX_INCLUDE = 16  # --include words one diagnosis, or one call to an agent, carries
MAX_INCLUDE_CHARS = 256


class WaitKind(enum.Enum):
    """What a thread blocked in a system call waits on, by the call and its descriptor."""

    PIPE = "pipe"
    SOCKET = "socket"
    LISTEN = "listen"  # a listening socket: a server waiting for connections, for work
    FILE_LOCK = "file_lock"
    FILE = "file"  # a read or write of a file or device that does not return
    CHILD = "child"
    THREAD = "thread"  # a futex: another thread of the process, or itself
    POLL = "poll"  # several descriptors at once, not resolved
    SLEEP = "sleep"
    OTHER = "other"  # a call with no known meaning here, or one that is not a wait


@dataclass(frozen=True, slots=True)
class ThreadWait:
    """One thread's wait, read from the kernel (``capture.read.waits``): the call, what it
    waits on and the processes at the other end (``peers``: pids the kernel's tables name,
    among those the caller may read); ``target`` is the kernel's name for the object
    (``pipe:[123]``, ``socket:[456]``, a path, ``pid 812``), "" where there is none."""

    native_id: int  # the thread's kernel id (``ThreadStack.native_id``)
    syscall: str
    kind: WaitKind
    fd: int | None = None
    target: str = ""
    peers: tuple[int, ...] = ()
    remote: str = ""  # "HOST:PORT" of a TCP peer that is not a process of this node
    local: str = ""  # with ``remote``: this end's "HOST:PORT", by which that node finds the peer
    # the node ``peers`` are on, where another node's agent named them (the far end of a
    # TCP connection); "" for this node
    peer_host: str = ""


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at one process: its threads' stacks and its counters, and, where they were
    read, what its blocked threads wait on."""

    t: float  # seconds since the capture started
    threads: tuple[ThreadStack, ...] = ()
    state: ProcessState | None = None
    error: CaptureError | None = None
    waits: tuple[ThreadWait, ...] = ()

    @property
    def gone(self) -> bool:
        """The process had exited when this sample was taken."""
        return self.error is not None and self.error.kind is CaptureErrorKind.PROCESS_GONE

    @property
    def has_native(self) -> bool:
        return any(map(_NATIVE, chain.from_iterable(map(_FRAMES, self.threads))))

    @property
    def python_stacks(self) -> tuple[tuple[int, tuple[Frame, ...]], ...]:
        return tuple((th.thread_id, tuple(f for f in th.frames if not f.native)) for th in self.threads)

    @property
    def main_thread(self) -> ThreadStack | None:
        for th in self.threads:
            if th.is_main:
                return th
        return self.threads[0] if self.threads else None


class RankSource(enum.Enum):
    """Where a rank's number came from."""

    ENV = "env"  # RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK / PMI_RANK in its environment
    INFERRED = "inferred"  # not in its start-up environment; derived from other evidence
    RAY = "ray"  # Ray Train's own record of its workers (run state or controller log)


@dataclass(frozen=True, slots=True)
class RankProcess:
    """A rank process found by discovery."""

    pid: int
    host: str
    rank: int | None
    rank_source: RankSource | None = None
    rank_evidence: str = ""  # e.g. "RANK=3" or "spawn index 2 among the launcher's children"
    world_size: int | None = None
    local_rank: int | None = None
    cmdline: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # selected variables, secrets redacted
    launcher_pid: int | None = None

    def env_get(self, key: str) -> str | None:
        for k, v in self.env:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class FlightEntry:
    """One collective or p2p op as a rank's flight recorder (torch's ``TORCH_FR_BUFFER_SIZE``
    ring) holds it. ``seq`` counts the group's collectives (its p2p ops when ``p2p``) on
    this rank: the same number on every member of the group is meant to be the same call."""

    group: str  # the process group's name ("0" is WORLD's)
    seq: int  # collective_seq_id, or p2p_seq_id for a p2p op
    op: str  # "all_reduce", "broadcast", "send", ... (the backend prefix dropped)
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_sizes: tuple[tuple[int, ...], ...] = ()
    output_dtypes: tuple[str, ...] = ()
    p2p: bool = False
    group_desc: str = ""  # "default_pg", a group_desc given at creation, or ""
    state: str = ""  # "scheduled", "started", "completed" (NCCL); gloo records "scheduled"
    retired: bool = False  # the op finished and left the ring's live part
    # a p2p op's other end as the dump names it (NCCL's "send 0->1", "recv 1<-0"): a rank
    # *of the group*, not a global rank; None where the dump does not say
    peer: int | None = None

    @property
    def finished(self) -> bool:
        """The op is over on this rank: retired, or NCCL saw it complete."""
        return self.retired or self.state == "completed"

    @property
    def signature(self) -> tuple[object, ...]:
        """What must agree across the group's members for the call to match."""
        return (self.op, self.input_sizes, self.input_dtypes)

    def describe(self) -> str:
        """``all_reduce Float[4]``, ``broadcast Long[3]+Long[3]``."""
        shapes = "+".join(
            f"{d}[{','.join(map(str, s))}]" for d, s in zip(self.input_dtypes, self.input_sizes, strict=False)
        )
        return f"{self.op} {shapes}".strip()


@dataclass(frozen=True, slots=True)
class FlightGroup:
    """A process group as the flight recorder's dump describes it."""

    name: str
    desc: str  # "default_pg", a user's group_desc, or ""
    ranks: tuple[int, ...]  # its members, as global ranks


@dataclass(frozen=True, slots=True)
class FlightRecord:
    """One rank's flight recorder dump: its recent ops and the groups they ran on."""

    entries: tuple[FlightEntry, ...]
    groups: tuple[FlightGroup, ...] = ()
    version: str = ""
    source: str = ""  # where it came from ("file trace_3", ...)
    # the ring still holds the first op the process recorded (record 0): nothing was
    # dropped, so counting a group's ops from its start is exact
    from_start: bool = False

    def group(self, name: str) -> FlightGroup | None:
        return next((g for g in self.groups if g.name == name), None)


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU a rank's process runs on, as NVML showed it on the rank's node at one
    instant (``hangdoc.capture.read.gpu``). Readings NVML would not give are None."""

    index: int  # NVML's index of the GPU on its node (nvidia-smi's numbering)
    uuid: str  # "GPU-8f6c...", the same in nvidia-smi, NVML and CUDA_VISIBLE_DEVICES
    name: str = ""  # "NVIDIA H100 80GB HBM3"
    # percent of NVML's last sample period (1/6 s to 1 s) in which a kernel ran on it
    utilization_percent: int | None = None
    memory_used_bytes: int | None = None  # by every process on the GPU
    memory_total_bytes: int | None = None
    process_memory_bytes: int | None = None  # by this rank's process alone
    xids: tuple[int, ...] = ()  # XID errors NVML delivered while hangdoc listened
    ecc_uncorrected: int | None = None  # uncorrectable ECC errors since the driver loaded
    lost: bool = False  # NVML: the GPU fell off the bus or is otherwise inaccessible
    # how the GPU was tied to the rank: "pid" (NVML lists the process), "pid N in its
    # namespace", or "CUDA_VISIBLE_DEVICES" (NVML's pids were of no process the agent sees)
    matched_by: str = "pid"

    def describe(self) -> str:
        """``GPU 3 (NVIDIA H100) 100% busy, 41.0/80.0 GiB, XID 79``."""
        parts = [f"GPU {self.index}" + (f" ({self.name})" if self.name else "")]
        if self.lost:
            parts.append("lost (fell off the bus or inaccessible)")
        if self.utilization_percent is not None:
            parts.append(f"{self.utilization_percent}% busy")
        if self.memory_used_bytes is not None and self.memory_total_bytes:
            parts.append(f"{self.memory_used_bytes / 2**30:.1f}/{self.memory_total_bytes / 2**30:.1f} GiB")
        if self.xids:
            parts.append("XID " + ",".join(map(str, self.xids)))
        if self.ecc_uncorrected:
            parts.append(counted(self.ecc_uncorrected, "uncorrectable ECC error"))
        if self.matched_by != "pid":
            parts.append(f"matched by {self.matched_by}")
        return " ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if parts[1:] else "")


@dataclass(frozen=True, slots=True)
class RasRank:
    """One rank of a NCCL communicator in NCCL's RAS report (``ncclras -f json``).

    ``comm_rank`` is the rank within the communicator, not the job's global rank; ``host``
    is the IP address RAS knows the process by and ``pid`` the process's own pid (in its
    pid namespace). Ranks RAS got no data from are ``missing``."""

    comm_rank: int
    host: str = ""  # "" where RAS did not know it ("unknown")
    pid: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    missing: bool = False
    unresponsive: bool = False  # missing: RAS could not reach its process
    dead: bool = False  # missing: unreachable for long enough that RAS gave it up
    init_state: int | None = None  # 0 ncclSuccess, 7 ncclInProgress, else an init error
    async_error: int | None = None  # what ncclCommGetAsyncError would return; 0: none
    finalize_called: bool = False
    destroy_flag: bool = False
    abort_flag: bool = False
    # (collective type, how many of them the rank has launched): ("AllReduce", 6650), ...
    collectives: tuple[tuple[str, int], ...] = ()

    @property
    def launched(self) -> int:
        """Collectives launched on the communicator, all types together."""
        return sum(count for _, count in self.collectives)


@dataclass(frozen=True, slots=True)
class RasCommunicator:
    """A NCCL communicator as RAS reported it: its hash and its ranks, present and missing."""

    hash: str  # "0xae94423cfbb2ef4a", as in NCCL's own logs
    size: int
    ranks: tuple[RasRank, ...] = ()

    @property
    def missing(self) -> tuple[RasRank, ...]:
        return tuple(r for r in self.ranks if r.missing)


@dataclass(frozen=True, slots=True)
class NcclRasReport:
    """NCCL's RAS view of the whole job, from one ``ncclras -f json`` query on one node."""

    nccl_version: str
    communicators: tuple[RasCommunicator, ...] = ()
    timeouts: int = 0  # RAS's own timeouts while it gathered the data
    collection_seconds: float = 0.0
    source: str = ""  # "ncclras on node-3"; says when malformed 2.28 JSON was repaired


@dataclass(frozen=True, slots=True)
class RankSnapshot:
    """Everything captured about one rank over the sampling window."""

    process: RankProcess
    samples: tuple[Sample, ...]
    flight: FlightRecord | None = None  # its flight recorder dump, when one was had
    gpus: tuple[GpuState, ...] = ()  # the GPUs its process runs on, where NVML could say
    # what its in-process probe (hangdoc.probe) told, when it runs one: the exception each
    # thread was handling, and its last step heartbeat
    exceptions: tuple[ThreadException, ...] = ()
    heartbeat: Heartbeat | None = None

    @property
    def rank(self) -> int | None:
        return self.process.rank

    @property
    def good_samples(self) -> tuple[Sample, ...]:
        return tuple([s for s in self.samples if s.error is None and s.threads])

    @property
    def latest(self) -> Sample | None:
        """The last good sample, or the last one with native frames when the stacks have not
        moved since: a native dump taken once, on demand, stays the view of where it is."""
        good = self.good_samples
        if not good:
            return None
        last = good[-1]
        if last.has_native:
            return last
        for earlier in reversed(good[:-1]):
            if earlier.has_native:
                return earlier if earlier.python_stacks == last.python_stacks else last
        return last


# How far back from a frame's line capture keeps (and analysis looks at) its function.
MAX_LINES_BEFORE = 80


@dataclass(frozen=True, slots=True)
class SourceFile:
    """Lines of a source file as they were on the node at capture time.

    Only the lines around user frames are kept (each frame's function up to its current
    line), so that analysis can see ``finally:``/``except``/``async_op=True`` offline.
    """

    filename: str
    lines: tuple[tuple[int, str], ...]  # (line number, text), ascending

    def line(self, lineno: int) -> str | None:
        for n, text in self.lines:
            if n == lineno:
                return text
        return None


@dataclass(frozen=True, slots=True)
class Unreachable:
    """A node or agent that did not answer; its ranks are unknown, not missing."""

    target: str
    reason: str
    ranks: tuple[int, ...] = ()


class NoteKind(enum.Enum):
    """What a note is about. Reporters group the alike notes of many nodes by it (never by
    their words); a kind other than ``OTHER`` says the same thing on every node, whatever
    the numbers in it."""

    OTHER = "other"  # said once, or alike only where the words are the same
    NOT_RANKS = "not_ranks"  # processes below ranks (DataLoader, compile workers): ``pids``
    LOCAL_RANKS = "local_ranks"  # ranks read from LOCAL_RANK under one parent: ``pids``
    NO_RANK = "no_rank"  # a process of the job with no rank in its start-up environment
    SPAWN_ORDER = "spawn_order"  # ranks inferred from the spawn children's start order
    RANK_CLAIMED = "rank_claimed"  # one rank claimed by several processes
    BAD_ENV = "bad_env"  # a rank or size variable with no valid number
    UNREADABLE = "unreadable"  # processes the caller may not read
    OTHER_USER = "other_user"  # processes of another user left out
    WIDENED = "widened"  # a rank's pid widened to its job on the node
    NO_RANK_THERE = "no_rank_there"  # a node that answered and holds no rank of the job
    WINDOW = "window"  # the observation window extended, or ended still ambiguous

    @classmethod
    def read(cls, value: str) -> NoteKind:
        """The kind ``value`` names, as a bundle or an agent wrote it; ``OTHER`` for a kind
        of a newer hangdoc (only grouping reads a kind, so nothing is lost but that)."""
        try:
            return cls(value)
        except ValueError:
            return cls.OTHER


@dataclass(frozen=True, slots=True)
class Note:
    """How capture went, as a value: its words (``text``), what it is about (``kind``), the
    node that said it ("" for the job as a whole, or a job of one node), and the processes
    it lists: ``pids`` all of them, ``listed`` the words that list them (cut where long)."""

    text: str
    kind: NoteKind = NoteKind.OTHER
    node: str = ""
    pids: tuple[int, ...] = ()
    listed: str = ""

    def words(self) -> str:
        """The note as one line: ``node7: not counted as ranks (…): pid 4242 (…)``."""
        said = f"{self.text}: {self.listed}" if self.listed else self.text
        return f"{self.node}: {said}" if self.node else said


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """The merged capture of one job: the input of every analysis function."""

    spec: str
    ranks: tuple[RankSnapshot, ...]
    world_size: int | None = None
    unreachable: tuple[Unreachable, ...] = ()
    window_seconds: float = 0.0
    captured_at: str = ""  # UTC ISO-8601
    hangdoc_version: str = ""
    notes: tuple[Note, ...] = ()  # how capture went: window extended, samples failed, ...
    sources: tuple[SourceFile, ...] = ()
    ras: NcclRasReport | None = None  # NCCL's RAS report of the job, where one was had
    # stacks read from text a person may have cut (a pasted ``py-spy dump``): a main thread
    # without its ``<module>`` frame is then no sign of an exit handler
    stacks_may_be_cut: bool = False
    # the ranks were found by searching their nodes' processes (a live capture); False for
    # ranks read from dump files, where a rank absent from the files is not seen, never
    # missing: a file holds what someone dumped, not every process of a node
    nodes_searched: bool = True
    # processes that are not ranks, sampled because a rank's wait leads to them (a server
    # it reads from, a DataLoader worker, a child), and those they wait on in turn
    beyond: tuple[RankSnapshot, ...] = ()

    def source(self, filename: str) -> SourceFile | None:
        for src in self.sources:
            if src.filename == filename:
                return src
        return None

    def by_rank(self) -> dict[int, RankSnapshot]:
        return {r.rank: r for r in self.ranks if r.rank is not None}


# ---------------------------------------------------------------- analysis results


class OpKind(enum.Enum):
    """What kind of distributed operation a rank is in."""

    COLLECTIVE = "collective"
    P2P = "p2p"
    INIT = "init"
    CLEANUP = "cleanup"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class DistOp:
    """The distributed operation a rank's thread is in, and who issued it."""

    kind: OpKind
    name: str  # all_reduce, send, barrier, init_process_group, destroy_process_group, ...
    call_site: Frame | None = None  # the innermost frame outside torch that issued it
    via: str = ""  # how it was recognised: "c10d call", "Work.wait", "funcol wait", "native", ...
    peer: int | None = None  # p2p: the other side's global rank, when known
    in_cleanup: bool = False  # the op runs inside a cleanup path (finally/__exit__/atexit)
    cleanup_frame: Frame | None = None  # the frame that makes it cleanup
    # the job's and its libraries' frames that led to the op, outermost first, ending at
    # ``call_site``: a wrapper (deepspeed.comm, an in-house all_reduce_mean) called from
    # different lines is a different program point
    path: tuple[Frame, ...] = ()
    # the process group it runs on, from the call's arguments (``FrameLocals``): WORLD_GROUP,
    # GIVEN_GROUP, ``name:NAME`` for a group known by name; None when not captured
    group: str | None = None

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        """What must be equal across ranks for them to be in the same collective: the op and
        the program point that issued it (the whole path of the job's frames to it)."""
        if self.path:
            return (self.name, tuple(f.location for f in self.path))
        return (self.name, (self.call_site.location,) if self.call_site else ())

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the job's own code on the path (below any library)."""
        for frame in reversed(self.path):
            if frame.origin.kind is Origin.USER:
                return frame
        return None

    def describe(self) -> str:
        if self.call_site is None:
            return self.name
        user = self.user_frame
        via = f" from {user.location}" if user is not None and user is not self.call_site else ""
        return f"{self.name} ({self.call_site.location}{via})"


WORLD_GROUP = "WORLD"  # no group argument (or ``group=None``): the default group of all ranks
GIVEN_GROUP = "given"  # the caller passed a ProcessGroup object; which one is not visible


class RankState(enum.Enum):
    """What a rank was doing over the window."""

    WAITING = "waiting"  # blocked in a distributed op, nothing moving
    COMMUNICATING = "communicating"  # in a distributed op, bytes/CPU moving
    BUSY = "busy"  # on CPU outside any distributed op
    BLOCKED = "blocked"  # off CPU outside any distributed op: lock, I/O, sleep
    STOPPED = "stopped"  # SIGSTOP / traced
    PROGRESSING = "progressing"  # its stack changed between samples
    EXITED = "exited"  # gone during capture
    UNREADABLE = "unreadable"  # no stacks (ptrace refused, not Python, ...)
    MISSING = "missing"  # expected from the world size, no process
    UNKNOWN = "unknown"  # on an unreachable node


class Verdict(enum.Enum):
    """The hang kinds (docs/verdicts.md); each member's docstring is its meaning."""

    NOT_HUNG = "not_hung"
    """The job is making progress."""
    CLEANUP_DEADLOCK = "cleanup_deadlock"
    """Some ranks wait in cleanup code while the others wait in the training loop (Pattern A)."""
    COLLECTIVE_MISMATCH = "collective_mismatch"
    """Ranks wait in different collectives / call sites / groups, or p2p peers do not pair (B)."""
    NCCL_TIMEOUT = "nccl_timeout"
    """Every rank waits in the same collective and nothing moves: transport problem (C)."""
    STRAGGLER = "straggler"
    """Most ranks wait in a collective; some are elsewhere: computing, locked, in I/O."""
    RANK_MISSING = "rank_missing"
    """Ranks wait for a peer that has no process."""
    INIT_DEADLOCK = "init_deadlock"
    """Ranks are stuck in rendezvous / process-group creation with all processes present."""
    EXTERNAL_WAIT = "external_wait"
    """Every rank waits outside torch.distributed on something outside the job (a server, a
    child process, a file lock): ``Diagnosis.root_cause`` names what holds them."""
    UNKNOWN = "unknown"
    """Not enough evidence; the report says what is missing."""


class Confidence(enum.Enum):
    """How sure a verdict is (docs/verdicts.md#confidence); ``Diagnosis.basis`` says why."""

    HIGH = "high"
    """Act on it: every rank that matters was read in several samples, their ops were read
    from torch.distributed frames, and the culprits are named by their own stacks."""
    MEDIUM = "medium"
    """Likely right, but check the basis first: some evidence is indirect or incomplete
    (a node did not answer, an op recognised from a .wait() line or native frames, one
    sample only, a rank still working that may only be slow)."""
    LOW = "low"
    """A lead, not a conclusion: the verdict rests on elimination, on no evidence at all
    (``unknown``), or cannot name whom to blame; the basis says what would settle it."""


@dataclass(frozen=True, slots=True)
class RankAnalysis:
    """Per-rank conclusions the report prints."""

    rank: int | None
    pid: int | None
    host: str
    state: RankState
    op: DistOp | None
    thread: str | None  # the thread the op/state was found in
    group_id: int | None  # index into Diagnosis.groups
    detail: str = ""  # e.g. "in lock.acquire (train.py:40), thread 'MainThread'"
    # on CPU, moving bytes or changing its stack over the window (not wake-ups alone: a rank
    # polling a stale lock in a sleep loop wakes up forever without getting anywhere)
    working: bool = False


@dataclass(frozen=True, slots=True)
class StackGroup:
    """An equivalence class: ranks whose (main/relevant) stacks are identical."""

    group_id: int
    ranks: tuple[int, ...]
    stack: Stack
    op: DistOp | None


# ---------------------------------------------------------------- merged call tree

ROOT = 0  # the node id of a CallTree's root


@dataclass(frozen=True, slots=True)
class TreeNode:
    """A node of the merged call tree: one frame reached by a set of ranks."""

    node_id: int
    frame: Frame | None  # None at the root
    # sorted global ranks through this node; the nodes of an unbranched stretch share one
    # tuple object (the trunk holds one tuple of every rank, not one per frame)
    ranks: tuple[int, ...]
    depth: int  # 0 at the root
    children: tuple[int, ...] = ()  # child node ids, in insertion order, which follows rank order


@dataclass(frozen=True, slots=True)
class CallTree:
    """The ranks' stacks merged into one prefix tree, with its equivalence classes (as LLNL
    STAT). Built once per diagnosis by ``hangdoc.analysis.merge.build_tree``.

    ``nodes[i]`` is the node with id ``i``, the root (``ROOT``) first. The classes,
    divergence points and outliers are computed when the tree is built.
    """

    nodes: tuple[TreeNode, ...]
    # the equivalence classes (ranks, stack), largest class first, then by lowest rank
    classes: tuple[tuple[tuple[int, ...], Stack], ...]
    divergence: tuple[int, ...]  # ids of the divergence points, in depth-first preorder
    # ids of the nodes on outlier branches: minority branches at a divergence point whose
    # ranks stand elsewhere than the majority's, or that hold culprits; never the majority
    # branch (the rule: hangdoc.analysis.merge's docstring). A branch's nodes are all in it.
    outliers: frozenset[int]

    def node(self, node_id: int) -> TreeNode:
        """The node with id ``node_id``."""
        return self.nodes[node_id]

    def children(self, node_id: int) -> tuple[TreeNode, ...]:
        """The children of node ``node_id``, in rank order."""
        return tuple(self.nodes[c] for c in self.nodes[node_id].children)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank in the tree, sorted."""
        return self.nodes[ROOT].ranks

    def divergence_points(self) -> tuple[TreeNode, ...]:
        """Nodes where ranks split into different branches (STAT's first places to look)."""
        return tuple(self.nodes[n] for n in self.divergence)

    def __len__(self) -> int:
        """The number of nodes, the root included."""
        return len(self.nodes)


@dataclass(frozen=True)
class Scope:
    """What a diagnosis saw of the job: a verdict speaks only for the ranks seen."""

    seen: tuple[int, ...] = ()  # ranks whose process was captured (readable or not)
    not_seen: tuple[int, ...] = ()  # expected, but on nodes not searched or not answering
    absent: tuple[int, ...] = ()  # no process, on positive evidence (``rank_missing``'s)
    world_size: int | None = None  # from the ranks' environment or code; None when nothing says

    @property
    def whole(self) -> bool:
        """Every rank of the job was seen or proven absent (an unknown size is not whole)."""
        return self.world_size is not None and not self.not_seen


@dataclass(frozen=True, slots=True)
class Evidence:
    """One thing a verdict rests on, as a value: its words, and the rank they are said of
    where they are said of one rank (``rank 3`` + ``is on a cleanup path: …``), so that a
    reporter can say alike evidence of many ranks once, without reading the words."""

    text: str
    rank: int | None = None

    def words(self) -> str:
        return f"rank {self.rank} {self.text}" if self.rank is not None else self.text


class LinkKind(enum.Enum):
    """How one process of a wait chain waits on the next (the JSON report's ``waits``)."""

    COLLECTIVE = "collective"  # in a torch.distributed op, for the rank named next
    SOCKET = "socket"
    PIPE = "pipe"
    QUEUE = "queue"  # a multiprocessing or thread queue: a pipe or a futex, by the frames
    CHILD = "child"
    RAY_TASK = "ray_task"
    LOCK = "lock"  # a lock of its own process, or one shared with another process
    FILE_LOCK = "file_lock"
    THREAD = "thread"  # another thread of its process: a join, a Future, a futex
    CONDITION = "condition"  # a Condition or Event nobody sets


@dataclass(frozen=True, slots=True)
class WaitLink:
    """One step of a wait chain: a process (a rank, or a process ``JobSnapshot.beyond``
    holds), the thread that waits, where, and on what (``on``: the kernel's words for it:
    ``127.0.0.1:8000``, ``pipe:[123]``, ``rank 0``, a path). ``waits`` is None at the end
    of a chain where the process does not wait on another one (it runs, or is blocked in
    the kernel, a lock of its own or a sleep)."""

    pid: int
    host: str
    rank: int | None
    thread: str | None
    frame: Frame | None
    waits: LinkKind | None = None
    on: str = ""
    command: tuple[str, ...] = ()  # what it runs: its command line (redacted), at most 8 words
    # how sure the link is: the kernel's tables named the other end (a descriptor's holder,
    # a child, a lock's holder, a file), or the stacks only show it (a queue, a condition,
    # a collective, an idle event loop's one connection)
    certain: bool = False


@dataclass(frozen=True, slots=True)
class RootCause:
    """The process and thread at the end of the wait the ranks are in, and the links that
    lead there from the ranks (the last link is the root itself). ``cycle``: the chain came
    back to a process already in it: a deadlock across processes, the root one of them.
    ``how`` says how each link was established, in the order of ``chain``."""

    pid: int
    host: str
    rank: int | None
    thread: str | None
    frame: Frame | None
    chain: tuple[WaitLink, ...]
    cycle: bool = False
    how: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    """The result of analysis: a verdict, its culprits and the evidence."""

    verdict: Verdict
    culprit_ranks: tuple[int, ...]
    summary: str
    evidence: tuple[Evidence, ...]
    next_steps: tuple[str, ...]
    ranks: tuple[RankAnalysis, ...]
    groups: tuple[StackGroup, ...]
    observed_seconds: float = 0.0
    partial: bool = False  # some evidence is missing (unreachable nodes, unreadable ranks)
    # the merged call tree, built once by the analysis and read by every reporter
    tree: CallTree | None = field(default=None, compare=False, hash=False)
    # the evidence fits a hang and slow progress alike (one rank busy while the others
    # wait): capture should watch longer, up to its max window, before this is final
    ambiguous: bool = False
    # how sure the verdict is (``analysis.confidence``); LOW unless judged: a diagnosis
    # nobody weighed (hand-built, a failed run's report) must not claim certainty
    confidence: Confidence = Confidence.LOW
    # short phrases: the evidence the verdict rests on, then what lowers the confidence
    basis: tuple[str, ...] = ()
    scope: Scope = field(default_factory=Scope)
    # the process at the end of the wait (a server, a worker, a child), where the wait was
    # followed past the ranks; None when no chain leaves the ranks
    root_cause: RootCause | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One process's last ``hangdoc.heartbeat()``/``hangdoc.step()``, as a watchdog reads it."""

    pid: int  # as the reader sees it (the host's pid, also for a rank in a container)
    step: int | None
    beats: int
    in_step: bool
    age_seconds: float  # since the last beat


@dataclass(frozen=True, slots=True)
class ThreadException:
    """The exception one thread of a rank was handling when its probe was asked
    (``sys._current_exceptions()``: inside an ``except``, a ``finally`` or an ``__exit__``
    that an exception entered): its type and where it was raised, never its message or any
    value (docs/security.md)."""

    thread_id: int  # threading.get_ident(): py-spy's ``ThreadStack.thread_id``
    thread_name: str | None
    type_name: str  # qualified: "RuntimeError", "torch.distributed.DistBackendError"
    raised_at: Frame  # the innermost entry of its traceback


class ProbeStatus(enum.Enum):
    """What asking a process's in-process probe came to."""

    ANSWERED = "answered"
    """It answered; ``ProbeAnswer.reason`` says what it could not tell (no flight recorder)."""
    NO_PROBE = "no_probe"
    """The process runs no probe: the common case, not an error."""
    FAILED = "failed"
    """It has a probe that did not answer in time, refused, or sent what cannot be read."""


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What one process's probe told (``hangdoc.capture.read.probe_client``)."""

    status: ProbeStatus
    reason: str = ""  # why something is missing: no probe, no answer, no flight recorder
    flight: FlightRecord | None = None
    heartbeat: Heartbeat | None = None
    exceptions: tuple[ThreadException, ...] = ()
