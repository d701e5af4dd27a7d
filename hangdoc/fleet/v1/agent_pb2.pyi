from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANK_SOURCE_UNSPECIFIED: _ClassVar[RankSource]
    RANK_SOURCE_ENV: _ClassVar[RankSource]
    RANK_SOURCE_INFERRED: _ClassVar[RankSource]
    RANK_SOURCE_RAY: _ClassVar[RankSource]

class CaptureErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPTURE_ERROR_KIND_UNSPECIFIED: _ClassVar[CaptureErrorKind]
    CAPTURE_ERROR_KIND_PROCESS_GONE: _ClassVar[CaptureErrorKind]
    CAPTURE_ERROR_KIND_PTRACE_DENIED: _ClassVar[CaptureErrorKind]
    CAPTURE_ERROR_KIND_NOT_PYTHON: _ClassVar[CaptureErrorKind]
    CAPTURE_ERROR_KIND_TIMEOUT: _ClassVar[CaptureErrorKind]
    CAPTURE_ERROR_KIND_PYSPY_MISSING: _ClassVar[CaptureErrorKind]
    CAPTURE_ERROR_KIND_PYSPY_FAILED: _ClassVar[CaptureErrorKind]

class WaitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_KIND_UNSPECIFIED: _ClassVar[WaitKind]
    WAIT_KIND_PIPE: _ClassVar[WaitKind]
    WAIT_KIND_SOCKET: _ClassVar[WaitKind]
    WAIT_KIND_FILE_LOCK: _ClassVar[WaitKind]
    WAIT_KIND_FILE: _ClassVar[WaitKind]
    WAIT_KIND_CHILD: _ClassVar[WaitKind]
    WAIT_KIND_THREAD: _ClassVar[WaitKind]
    WAIT_KIND_POLL: _ClassVar[WaitKind]
    WAIT_KIND_SLEEP: _ClassVar[WaitKind]
    WAIT_KIND_OTHER: _ClassVar[WaitKind]
    WAIT_KIND_LISTEN: _ClassVar[WaitKind]

class ProbeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_STATUS_UNSPECIFIED: _ClassVar[ProbeStatus]
    PROBE_STATUS_ANSWERED: _ClassVar[ProbeStatus]
    PROBE_STATUS_NO_PROBE: _ClassVar[ProbeStatus]
    PROBE_STATUS_FAILED: _ClassVar[ProbeStatus]
RANK_SOURCE_UNSPECIFIED: RankSource
RANK_SOURCE_ENV: RankSource
RANK_SOURCE_INFERRED: RankSource
RANK_SOURCE_RAY: RankSource
CAPTURE_ERROR_KIND_UNSPECIFIED: CaptureErrorKind
CAPTURE_ERROR_KIND_PROCESS_GONE: CaptureErrorKind
CAPTURE_ERROR_KIND_PTRACE_DENIED: CaptureErrorKind
CAPTURE_ERROR_KIND_NOT_PYTHON: CaptureErrorKind
CAPTURE_ERROR_KIND_TIMEOUT: CaptureErrorKind
CAPTURE_ERROR_KIND_PYSPY_MISSING: CaptureErrorKind
CAPTURE_ERROR_KIND_PYSPY_FAILED: CaptureErrorKind
WAIT_KIND_UNSPECIFIED: WaitKind
WAIT_KIND_PIPE: WaitKind
WAIT_KIND_SOCKET: WaitKind
WAIT_KIND_FILE_LOCK: WaitKind
WAIT_KIND_FILE: WaitKind
WAIT_KIND_CHILD: WaitKind
WAIT_KIND_THREAD: WaitKind
WAIT_KIND_POLL: WaitKind
WAIT_KIND_SLEEP: WaitKind
WAIT_KIND_OTHER: WaitKind
WAIT_KIND_LISTEN: WaitKind
PROBE_STATUS_UNSPECIFIED: ProbeStatus
PROBE_STATUS_ANSWERED: ProbeStatus
PROBE_STATUS_NO_PROBE: ProbeStatus
PROBE_STATUS_FAILED: ProbeStatus

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("hangdoc_version", "schema_version", "api_version", "host", "pid", "pyspy_path", "native", "features", "python_version")
    HANGDOC_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PYSPY_PATH_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    hangdoc_version: str
    schema_version: int
    api_version: str
    host: str
    pid: int
    pyspy_path: str
    native: bool
    features: _containers.RepeatedScalarFieldContainer[str]
    python_version: str
    def __init__(self, hangdoc_version: _Optional[str] = ..., schema_version: _Optional[int] = ..., api_version: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., pyspy_path: _Optional[str] = ..., native: _Optional[bool] = ..., features: _Optional[_Iterable[str]] = ..., python_version: _Optional[str] = ...) -> None: ...

class FindRanksRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class Discovery(_message.Message):
    __slots__ = ("ranks", "world_size", "notes", "searched", "elsewhere", "noted", "agent")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    SEARCHED_FIELD_NUMBER: _ClassVar[int]
    ELSEWHERE_FIELD_NUMBER: _ClassVar[int]
    NOTED_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedCompositeFieldContainer[RankProcess]
    world_size: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    searched: str
    elsewhere: Elsewhere
    noted: _containers.RepeatedCompositeFieldContainer[Note]
    agent: AgentInfo
    def __init__(self, ranks: _Optional[_Iterable[_Union[RankProcess, _Mapping]]] = ..., world_size: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., searched: _Optional[str] = ..., elsewhere: _Optional[_Union[Elsewhere, _Mapping]] = ..., noted: _Optional[_Iterable[_Union[Note, _Mapping]]] = ..., agent: _Optional[_Union[AgentInfo, _Mapping]] = ...) -> None: ...

class Note(_message.Message):
    __slots__ = ("text", "kind", "pids", "listed")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    LISTED_FIELD_NUMBER: _ClassVar[int]
    text: str
    kind: str
    pids: _containers.RepeatedScalarFieldContainer[int]
    listed: str
    def __init__(self, text: _Optional[str] = ..., kind: _Optional[str] = ..., pids: _Optional[_Iterable[int]] = ..., listed: _Optional[str] = ...) -> None: ...

class Elsewhere(_message.Message):
    __slots__ = ("host", "why", "nodes", "job")
    HOST_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    host: str
    why: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    job: str
    def __init__(self, host: _Optional[str] = ..., why: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., job: _Optional[str] = ...) -> None: ...

class EnvVar(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RankProcess(_message.Message):
    __slots__ = ("pid", "host", "rank", "rank_source", "rank_evidence", "world_size", "local_rank", "cmdline", "env", "launcher_pid")
    PID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    RANK_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RANK_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    CMDLINE_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_PID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    host: str
    rank: int
    rank_source: RankSource
    rank_evidence: str
    world_size: int
    local_rank: int
    cmdline: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    launcher_pid: int
    def __init__(self, pid: _Optional[int] = ..., host: _Optional[str] = ..., rank: _Optional[int] = ..., rank_source: _Optional[_Union[RankSource, str]] = ..., rank_evidence: _Optional[str] = ..., world_size: _Optional[int] = ..., local_rank: _Optional[int] = ..., cmdline: _Optional[_Iterable[str]] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., launcher_pid: _Optional[int] = ...) -> None: ...

class RankProcessList(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[RankProcess]
    def __init__(self, processes: _Optional[_Iterable[_Union[RankProcess, _Mapping]]] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("job", "processes", "t", "native", "timeout_seconds")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    T_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job: str
    processes: RankProcessList
    t: float
    native: bool
    timeout_seconds: float
    def __init__(self, job: _Optional[str] = ..., processes: _Optional[_Union[RankProcessList, _Mapping]] = ..., t: _Optional[float] = ..., native: _Optional[bool] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("function", "filename", "line", "native", "code")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    function: str
    filename: str
    line: int
    native: bool
    code: str
    def __init__(self, function: _Optional[str] = ..., filename: _Optional[str] = ..., line: _Optional[int] = ..., native: _Optional[bool] = ..., code: _Optional[str] = ...) -> None: ...

class Stack(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, frames: _Optional[_Iterable[int]] = ...) -> None: ...

class ThreadStack(_message.Message):
    __slots__ = ("thread_id", "name", "stack", "native_id", "active", "owns_gil", "locals")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STACK_FIELD_NUMBER: _ClassVar[int]
    NATIVE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    OWNS_GIL_FIELD_NUMBER: _ClassVar[int]
    LOCALS_FIELD_NUMBER: _ClassVar[int]
    thread_id: int
    name: str
    stack: int
    native_id: int
    active: bool
    owns_gil: bool
    locals: _containers.RepeatedCompositeFieldContainer[FrameLocals]
    def __init__(self, thread_id: _Optional[int] = ..., name: _Optional[str] = ..., stack: _Optional[int] = ..., native_id: _Optional[int] = ..., active: _Optional[bool] = ..., owns_gil: _Optional[bool] = ..., locals: _Optional[_Iterable[_Union[FrameLocals, _Mapping]]] = ...) -> None: ...

class FrameLocals(_message.Message):
    __slots__ = ("index", "values")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    index: int
    values: _containers.RepeatedCompositeFieldContainer[LocalValue]
    def __init__(self, index: _Optional[int] = ..., values: _Optional[_Iterable[_Union[LocalValue, _Mapping]]] = ...) -> None: ...

class LocalValue(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ThreadCounters(_message.Message):
    __slots__ = ("native_id", "cpu_seconds", "ctx_switches", "read_chars", "write_chars")
    NATIVE_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CTX_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    READ_CHARS_FIELD_NUMBER: _ClassVar[int]
    WRITE_CHARS_FIELD_NUMBER: _ClassVar[int]
    native_id: int
    cpu_seconds: float
    ctx_switches: int
    read_chars: int
    write_chars: int
    def __init__(self, native_id: _Optional[int] = ..., cpu_seconds: _Optional[float] = ..., ctx_switches: _Optional[int] = ..., read_chars: _Optional[int] = ..., write_chars: _Optional[int] = ...) -> None: ...

class ProcessState(_message.Message):
    __slots__ = ("status", "cpu_seconds", "num_threads", "read_chars", "write_chars", "ctx_switches", "rss_bytes", "threads")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUM_THREADS_FIELD_NUMBER: _ClassVar[int]
    READ_CHARS_FIELD_NUMBER: _ClassVar[int]
    WRITE_CHARS_FIELD_NUMBER: _ClassVar[int]
    CTX_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    status: str
    cpu_seconds: float
    num_threads: int
    read_chars: int
    write_chars: int
    ctx_switches: int
    rss_bytes: int
    threads: _containers.RepeatedCompositeFieldContainer[ThreadCounters]
    def __init__(self, status: _Optional[str] = ..., cpu_seconds: _Optional[float] = ..., num_threads: _Optional[int] = ..., read_chars: _Optional[int] = ..., write_chars: _Optional[int] = ..., ctx_switches: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., threads: _Optional[_Iterable[_Union[ThreadCounters, _Mapping]]] = ...) -> None: ...

class CaptureError(_message.Message):
    __slots__ = ("kind", "message")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: CaptureErrorKind
    message: str
    def __init__(self, kind: _Optional[_Union[CaptureErrorKind, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("t", "threads", "state", "error", "waits")
    T_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    t: float
    threads: _containers.RepeatedCompositeFieldContainer[ThreadStack]
    state: ProcessState
    error: CaptureError
    waits: _containers.RepeatedCompositeFieldContainer[ThreadWait]
    def __init__(self, t: _Optional[float] = ..., threads: _Optional[_Iterable[_Union[ThreadStack, _Mapping]]] = ..., state: _Optional[_Union[ProcessState, _Mapping]] = ..., error: _Optional[_Union[CaptureError, _Mapping]] = ..., waits: _Optional[_Iterable[_Union[ThreadWait, _Mapping]]] = ...) -> None: ...

class ThreadWait(_message.Message):
    __slots__ = ("native_id", "syscall", "kind", "fd", "target", "peers", "remote", "local", "peer_host")
    NATIVE_ID_FIELD_NUMBER: _ClassVar[int]
    SYSCALL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    PEER_HOST_FIELD_NUMBER: _ClassVar[int]
    native_id: int
    syscall: str
    kind: WaitKind
    fd: int
    target: str
    peers: _containers.RepeatedScalarFieldContainer[int]
    remote: str
    local: str
    peer_host: str
    def __init__(self, native_id: _Optional[int] = ..., syscall: _Optional[str] = ..., kind: _Optional[_Union[WaitKind, str]] = ..., fd: _Optional[int] = ..., target: _Optional[str] = ..., peers: _Optional[_Iterable[int]] = ..., remote: _Optional[str] = ..., local: _Optional[str] = ..., peer_host: _Optional[str] = ...) -> None: ...

class PidSample(_message.Message):
    __slots__ = ("pid", "sample")
    PID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    sample: Sample
    def __init__(self, pid: _Optional[int] = ..., sample: _Optional[_Union[Sample, _Mapping]] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("frames", "stacks", "samples", "discovery")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    stacks: _containers.RepeatedCompositeFieldContainer[Stack]
    samples: _containers.RepeatedCompositeFieldContainer[PidSample]
    discovery: Discovery
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., stacks: _Optional[_Iterable[_Union[Stack, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[PidSample, _Mapping]]] = ..., discovery: _Optional[_Union[Discovery, _Mapping]] = ...) -> None: ...

class SourceQuery(_message.Message):
    __slots__ = ("pid", "frames")
    PID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    def __init__(self, pid: _Optional[int] = ..., frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ...) -> None: ...

class SampleSourcesRequest(_message.Message):
    __slots__ = ("frames", "queries")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    queries: _containers.RepeatedCompositeFieldContainer[SourceQuery]
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., queries: _Optional[_Iterable[_Union[SourceQuery, _Mapping]]] = ...) -> None: ...

class SourceLine(_message.Message):
    __slots__ = ("number", "text")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    number: int
    text: str
    def __init__(self, number: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class SourceFile(_message.Message):
    __slots__ = ("filename", "lines")
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    filename: str
    lines: _containers.RepeatedCompositeFieldContainer[SourceLine]
    def __init__(self, filename: _Optional[str] = ..., lines: _Optional[_Iterable[_Union[SourceLine, _Mapping]]] = ...) -> None: ...

class SampleSourcesResponse(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[SourceFile]
    def __init__(self, files: _Optional[_Iterable[_Union[SourceFile, _Mapping]]] = ...) -> None: ...

class HeartbeatsRequest(_message.Message):
    __slots__ = ("pids",)
    PIDS_FIELD_NUMBER: _ClassVar[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pids: _Optional[_Iterable[int]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("pid", "step", "beats", "in_step", "age_seconds")
    PID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BEATS_FIELD_NUMBER: _ClassVar[int]
    IN_STEP_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    step: int
    beats: int
    in_step: bool
    age_seconds: float
    def __init__(self, pid: _Optional[int] = ..., step: _Optional[int] = ..., beats: _Optional[int] = ..., in_step: _Optional[bool] = ..., age_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatsResponse(_message.Message):
    __slots__ = ("heartbeats",)
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    heartbeats: _containers.RepeatedCompositeFieldContainer[Heartbeat]
    def __init__(self, heartbeats: _Optional[_Iterable[_Union[Heartbeat, _Mapping]]] = ...) -> None: ...

class FlightRequest(_message.Message):
    __slots__ = ("pids", "timeout_seconds")
    PIDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    timeout_seconds: float
    def __init__(self, pids: _Optional[_Iterable[int]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class RankFlight(_message.Message):
    __slots__ = ("pid", "dump", "reason", "status", "heartbeat", "exceptions")
    PID_FIELD_NUMBER: _ClassVar[int]
    DUMP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    EXCEPTIONS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    dump: str
    reason: str
    status: ProbeStatus
    heartbeat: Heartbeat
    exceptions: _containers.RepeatedCompositeFieldContainer[ThreadException]
    def __init__(self, pid: _Optional[int] = ..., dump: _Optional[str] = ..., reason: _Optional[str] = ..., status: _Optional[_Union[ProbeStatus, str]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., exceptions: _Optional[_Iterable[_Union[ThreadException, _Mapping]]] = ...) -> None: ...

class ThreadException(_message.Message):
    __slots__ = ("thread_id", "thread_name", "type_name", "raised_at")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    RAISED_AT_FIELD_NUMBER: _ClassVar[int]
    thread_id: int
    thread_name: str
    type_name: str
    raised_at: Frame
    def __init__(self, thread_id: _Optional[int] = ..., thread_name: _Optional[str] = ..., type_name: _Optional[str] = ..., raised_at: _Optional[_Union[Frame, _Mapping]] = ...) -> None: ...

class FlightResponse(_message.Message):
    __slots__ = ("ranks",)
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedCompositeFieldContainer[RankFlight]
    def __init__(self, ranks: _Optional[_Iterable[_Union[RankFlight, _Mapping]]] = ...) -> None: ...

class DevicesRequest(_message.Message):
    __slots__ = ("pids", "listen_seconds", "timeout_seconds", "ras")
    PIDS_FIELD_NUMBER: _ClassVar[int]
    LISTEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RAS_FIELD_NUMBER: _ClassVar[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    listen_seconds: float
    timeout_seconds: float
    ras: bool
    def __init__(self, pids: _Optional[_Iterable[int]] = ..., listen_seconds: _Optional[float] = ..., timeout_seconds: _Optional[float] = ..., ras: _Optional[bool] = ...) -> None: ...

class GpuState(_message.Message):
    __slots__ = ("index", "uuid", "name", "utilization_percent", "memory_used_bytes", "memory_total_bytes", "process_memory_bytes", "xids", "ecc_uncorrected", "lost", "matched_by")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESS_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    XIDS_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    MATCHED_BY_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    utilization_percent: int
    memory_used_bytes: int
    memory_total_bytes: int
    process_memory_bytes: int
    xids: _containers.RepeatedScalarFieldContainer[int]
    ecc_uncorrected: int
    lost: bool
    matched_by: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., utilization_percent: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., process_memory_bytes: _Optional[int] = ..., xids: _Optional[_Iterable[int]] = ..., ecc_uncorrected: _Optional[int] = ..., lost: _Optional[bool] = ..., matched_by: _Optional[str] = ...) -> None: ...

class RankGpus(_message.Message):
    __slots__ = ("pid", "gpus")
    PID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuState]
    def __init__(self, pid: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuState, _Mapping]]] = ...) -> None: ...

class DevicesResponse(_message.Message):
    __slots__ = ("ranks", "gpu_reason", "ras_output", "ras_reason")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    GPU_REASON_FIELD_NUMBER: _ClassVar[int]
    RAS_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RAS_REASON_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedCompositeFieldContainer[RankGpus]
    gpu_reason: str
    ras_output: str
    ras_reason: str
    def __init__(self, ranks: _Optional[_Iterable[_Union[RankGpus, _Mapping]]] = ..., gpu_reason: _Optional[str] = ..., ras_output: _Optional[str] = ..., ras_reason: _Optional[str] = ...) -> None: ...

class WaitsRequest(_message.Message):
    __slots__ = ("pids", "include", "sockets")
    PIDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    SOCKETS_FIELD_NUMBER: _ClassVar[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    include: _containers.RepeatedScalarFieldContainer[str]
    sockets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pids: _Optional[_Iterable[int]] = ..., include: _Optional[_Iterable[str]] = ..., sockets: _Optional[_Iterable[str]] = ...) -> None: ...

class SocketHolders(_message.Message):
    __slots__ = ("socket", "pids")
    SOCKET_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    socket: str
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, socket: _Optional[str] = ..., pids: _Optional[_Iterable[int]] = ...) -> None: ...

class PidWaits(_message.Message):
    __slots__ = ("pid", "waits")
    PID_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    waits: _containers.RepeatedCompositeFieldContainer[ThreadWait]
    def __init__(self, pid: _Optional[int] = ..., waits: _Optional[_Iterable[_Union[ThreadWait, _Mapping]]] = ...) -> None: ...

class WaitsResponse(_message.Message):
    __slots__ = ("waits", "peers", "holders")
    WAITS_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    waits: _containers.RepeatedCompositeFieldContainer[PidWaits]
    peers: _containers.RepeatedCompositeFieldContainer[RankProcess]
    holders: _containers.RepeatedCompositeFieldContainer[SocketHolders]
    def __init__(self, waits: _Optional[_Iterable[_Union[PidWaits, _Mapping]]] = ..., peers: _Optional[_Iterable[_Union[RankProcess, _Mapping]]] = ..., holders: _Optional[_Iterable[_Union[SocketHolders, _Mapping]]] = ...) -> None: ...

class JobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchedRank(_message.Message):
    __slots__ = ("pid", "rank", "still_seconds")
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    rank: int
    still_seconds: float
    def __init__(self, pid: _Optional[int] = ..., rank: _Optional[int] = ..., still_seconds: _Optional[float] = ...) -> None: ...

class WatchedJob(_message.Message):
    __slots__ = ("job", "world_size", "ranks")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    job: str
    world_size: int
    ranks: _containers.RepeatedCompositeFieldContainer[WatchedRank]
    def __init__(self, job: _Optional[str] = ..., world_size: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[WatchedRank, _Mapping]]] = ...) -> None: ...

class JobsResponse(_message.Message):
    __slots__ = ("host", "jobs", "left_out")
    HOST_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    host: str
    jobs: _containers.RepeatedCompositeFieldContainer[WatchedJob]
    left_out: int
    def __init__(self, host: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[WatchedJob, _Mapping]]] = ..., left_out: _Optional[int] = ...) -> None: ...

class RelayChild(_message.Message):
    __slots__ = ("address", "request", "timeout_seconds", "children", "connect_seconds")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    CONNECT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    address: str
    request: bytes
    timeout_seconds: float
    children: _containers.RepeatedCompositeFieldContainer[RelayChild]
    connect_seconds: float
    def __init__(self, address: _Optional[str] = ..., request: _Optional[bytes] = ..., timeout_seconds: _Optional[float] = ..., children: _Optional[_Iterable[_Union[RelayChild, _Mapping]]] = ..., connect_seconds: _Optional[float] = ...) -> None: ...

class RelayRequest(_message.Message):
    __slots__ = ("method", "children", "timeout_seconds")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    method: str
    children: _containers.RepeatedCompositeFieldContainer[RelayChild]
    timeout_seconds: float
    def __init__(self, method: _Optional[str] = ..., children: _Optional[_Iterable[_Union[RelayChild, _Mapping]]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class RelayFailure(_message.Message):
    __slots__ = ("message", "kind", "help", "relay")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    message: str
    kind: str
    help: str
    relay: str
    def __init__(self, message: _Optional[str] = ..., kind: _Optional[str] = ..., help: _Optional[str] = ..., relay: _Optional[str] = ...) -> None: ...

class RelayAnswer(_message.Message):
    __slots__ = ("target", "response", "failure")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    target: str
    response: bytes
    failure: RelayFailure
    def __init__(self, target: _Optional[str] = ..., response: _Optional[bytes] = ..., failure: _Optional[_Union[RelayFailure, _Mapping]] = ...) -> None: ...

class RelayTable(_message.Message):
    __slots__ = ("frames", "stacks", "nodes")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    stacks: _containers.RepeatedCompositeFieldContainer[Stack]
    nodes: _containers.RepeatedCompositeFieldContainer[RelayNodeSamples]
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., stacks: _Optional[_Iterable[_Union[Stack, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[RelayNodeSamples, _Mapping]]] = ...) -> None: ...

class RelayNodeSamples(_message.Message):
    __slots__ = ("target", "samples")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    target: str
    samples: _containers.RepeatedCompositeFieldContainer[PidSample]
    def __init__(self, target: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[PidSample, _Mapping]]] = ...) -> None: ...

class RelayResponse(_message.Message):
    __slots__ = ("answers", "tables")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[RelayAnswer]
    tables: _containers.RepeatedCompositeFieldContainer[RelayTable]
    def __init__(self, answers: _Optional[_Iterable[_Union[RelayAnswer, _Mapping]]] = ..., tables: _Optional[_Iterable[_Union[RelayTable, _Mapping]]] = ...) -> None: ...
