"""How much a bundle may make hangdoc hold: the ranges of the model's integers, and the caps
on what interning multiplies (frames, records, the tables' rows and items).

The checks import these names, so a test that lowers a cap sets it in the file whose check
it means (``tables``: what a read stores and uses).
"""

from __future__ import annotations

from ..model import (
    MAX_WORLD_SIZE,
    PID_MAX,
    Frame,
    FrameLocals,
    GpuState,
    Heartbeat,
    JobSnapshot,
    Note,
    ProcessState,
    RankProcess,
    RasCommunicator,
    RasRank,
    ThreadCounters,
    ThreadWait,
    Unreachable,
)

# Integer ranges (inclusive); model.MAX_WORLD_SIZE bounds ranks and world sizes.
# Stacks are interned, so a small file can make thousands of threads share one deep stack.
# The analysis works once per distinct shape of a rank's stacks, not per distinct stack, and
# ranks can each have a shape of their own, so the frames of all threads of all samples are
# capped, counted each time a stack is used. Measured (1,000 ranks of a shape each, threads
# 20,000 frames deep: 480 million frame uses analysed in 4.7 s, 0.16 s at the usual depth):
# about 10 ns a frame use, so 2**30 is about 10 s of analysis; the synthetic 1M-rank bundle
# (bench/synthetic.py: 3 samples, 4 to 12 threads a rank) uses 232 million. One stack holds
# at most MAX_STACK_DEPTH frames, far past Python's recursion limit (1000 by default).
MAX_STACK_DEPTH = 100_000
MAX_THREAD_FRAMES = 2**30
# Records are interned too (version 2), so a few numbers can make a rank hold a million
# samples of a million threads: the records reachable from the snapshot, counted each time
# they are used (a rank's samples, their threads, ...), are capped at MAX_RECORDS, twice the
# 31 million of the synthetic 1M-rank bundle. And since a table's rows can come from a few
# numbers (runs, columns left out), the tables together hold at most MAX_TABLE_ROWS rows
# and MAX_TABLE_ITEMS items of tuples. Each row is a Python object: the synthetic 1M-rank
# bundle's 17.1 million rows and 30 million items are 2.6 GiB once loaded (RSS), so a file
# at both caps could hold about 5 GiB.
MAX_RECORDS = 2**26
MAX_TABLE_ROWS = 2**25
MAX_TABLE_ITEMS = 2**26
_INT_RANGE = (-(2**63), 2**64 - 1)  # any other int: 64 bits (thread ids are pthread_t values)
_FIELD_RANGES: dict[tuple[type, str], tuple[int, int]] = {
    (JobSnapshot, "world_size"): (0, MAX_WORLD_SIZE),
    (RankProcess, "world_size"): (0, MAX_WORLD_SIZE),
    (RankProcess, "rank"): (0, MAX_WORLD_SIZE - 1),
    (RankProcess, "local_rank"): (0, MAX_WORLD_SIZE - 1),
    (RankProcess, "pid"): (0, PID_MAX),
    (RankProcess, "launcher_pid"): (0, PID_MAX),
    (Unreachable, "ranks"): (0, MAX_WORLD_SIZE - 1),
    (Note, "pids"): (0, PID_MAX),
    (Frame, "line"): (0, 2**31 - 1),
    (ProcessState, "num_threads"): (0, 2**31 - 1),
    (ThreadCounters, "native_id"): (0, PID_MAX),
    (ThreadWait, "native_id"): (0, PID_MAX),
    (ThreadWait, "peers"): (0, PID_MAX),
    (ThreadWait, "fd"): (0, 2**31 - 1),
    (FrameLocals, "index"): (0, MAX_STACK_DEPTH - 1),
    (GpuState, "utilization_percent"): (0, 100),
    (RasRank, "comm_rank"): (0, MAX_WORLD_SIZE - 1),
    (RasCommunicator, "size"): (0, MAX_WORLD_SIZE),
    (Heartbeat, "pid"): (0, PID_MAX),
    (Heartbeat, "beats"): (0, 2**63 - 1),
}
