"""Synthetic job snapshots shaped like real ones, for the scale benchmarks and tests.

Real captures of a large job are not at hand, so this module builds ``JobSnapshot`` values
of any size with the shape of a real one (measured on the recorded corpus and on traces of
large jobs): 8 ranks a node, 3 samples 0.5 s apart, 4 to 12 threads a rank (a main thread
36 to 67 frames deep in a Lightning-style training loop, plus data-loader, pin-memory,
queue-feeder, thread-pool, logger and watchdog threads), about 20 environment variables a
rank, pids and thread ids that differ per process, and a few hundred distinct stacks in
all (side threads sit at different lines; a model's forward nests to different depths).
Identical frames and stacks are shared objects, as the bundle loader interns them, and so
are a rank's threads (and its list of them) that did not change from one sample to the next,
as a capture shares them (``hangdoc.memo.share_values``) and a bundle read back does.

Each scenario is one verdict, with the culprits the analysis must name (``expected``)::

    nccl_timeout         every rank in the same all_reduce; no culprit
    collective_mismatch  one node's 8 ranks (the middle node) in a barrier from
                         save_checkpoint, the rest in the training all_reduce
    straggler            one rank (the middle one) computing, on CPU, the rest waiting
    cleanup_deadlock     the upper half in destroy_process_group under __exit__, the lower
                         half in the training all_reduce (the half-and-half case)
    init_deadlock        every rank in new_group's store barrier but one node's, which went
                         past it into the first all_reduce
    rank_missing         one rank (the middle one) has no process; the rest wait

Use it from Python (``bench/`` is not a package: put it on ``sys.path``)::

    from synthetic import synthetic_snapshot, expected
    snapshot = synthetic_snapshot(10_000, "collective_mismatch")
    verdict, culprits = expected(10_000, "collective_mismatch")

or write a bundle for ``hangdoc analyze``::

    python bench/synthetic.py --ranks 100000 --scenario straggler --out /tmp/s100k.json.gz
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hangdoc.model import (
    Frame,
    JobSnapshot,
    ProcessState,
    RankProcess,
    RankSnapshot,
    RankSource,
    Sample,
    Stack,
    ThreadStack,
    Verdict,
)

SCENARIOS = ("nccl_timeout", "collective_mismatch", "straggler", "cleanup_deadlock", "init_deadlock", "rank_missing")
RANKS_PER_NODE = 8
SAMPLES = 3
INTERVAL = 0.5

USER = "/workspace/llm/train.py"
MODEL = "/workspace/llm/model.py"
SITE = "/opt/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
LOGGER = f"{SITE}/torch/distributed/c10d_logger.py"
MODULE = f"{SITE}/torch/nn/modules/module.py"
PL = f"{SITE}/lightning/pytorch"


@functools.cache
def _frame(function: str, filename: str, line: int) -> Frame:
    """One shared ``Frame`` per distinct frame (interned, as the bundle loader does)."""
    return Frame(function, filename, line)


@functools.cache
def _stack(*frames: tuple[str, str, int]) -> Stack:
    """One shared stack per distinct stack (interned, as the bundle loader does)."""
    return tuple(_frame(*f) for f in frames)


# ------------------------------------------------------------------ main thread

_TRUNK = (  # <module> down to the training step: 24 frames, as in a Lightning run
    ("<module>", USER, 212),
    ("main", USER, 198),
    ("run", USER, 171),
    ("fit", f"{PL}/trainer/trainer.py", 538),
    ("_call_and_handle_interrupt", f"{PL}/trainer/call.py", 47),
    ("launch", f"{PL}/strategies/launchers/subprocess_script.py", 105),
    ("_fit_impl", f"{PL}/trainer/trainer.py", 574),
    ("_run", f"{PL}/trainer/trainer.py", 981),
    ("_run_stage", f"{PL}/trainer/trainer.py", 1025),
    ("run", f"{PL}/loops/fit_loop.py", 205),
    ("advance", f"{PL}/loops/fit_loop.py", 363),
    ("run", f"{PL}/loops/training_epoch_loop.py", 140),
    ("advance", f"{PL}/loops/training_epoch_loop.py", 250),
    ("run", f"{PL}/loops/optimization/automatic.py", 190),
    ("_optimizer_step", f"{PL}/loops/optimization/automatic.py", 268),
    ("_call_lightning_module_hook", f"{PL}/trainer/call.py", 167),
    ("optimizer_step", f"{PL}/core/module.py", 1306),
    ("step", f"{PL}/core/optimizer.py", 153),
    ("optimizer_step", f"{PL}/strategies/ddp.py", 270),
    ("optimizer_step", f"{PL}/plugins/precision/precision.py", 122),
    ("Optimizer.profile_hook_step.<locals>.wrapper", f"{SITE}/torch/optim/optimizer.py", 485),
    ("_use_grad_for_differentiable.<locals>._use_grad", f"{SITE}/torch/optim/optimizer.py", 79),
    ("AdamW.step", f"{SITE}/torch/optim/adamw.py", 220),
    ("closure", f"{PL}/loops/optimization/automatic.py", 146),
)
_STEP = (("training_step", USER, 88), ("reduce_metrics", USER, 64))
_ALL_REDUCE = (("wrapper", LOGGER, 81), ("all_reduce", C10D, 2806))
_BARRIER = (("wrapper", LOGGER, 81), ("barrier", C10D, 4159))


def _forward(depth: int, line: int) -> tuple[tuple[str, str, int], ...]:
    """A model's forward nested ``depth`` modules deep (3 frames each), ending at ``line``."""
    frames: list[tuple[str, str, int]] = [("training_step", USER, 84)]
    for level in range(depth):
        frames += [
            ("_wrapped_call_impl", MODULE, 1773),
            ("_call_impl", MODULE, 1784),
            ("forward", MODEL, 40 + 12 * level),
        ]
    frames.append(("attention", MODEL, line))
    return tuple(frames)


def _main_stack(scenario: str, rank: int, world: int, sample: int) -> Stack:
    """The main thread's stack of ``rank`` in ``sample`` (outermost first)."""
    role = _role(scenario, rank, world)
    if role == "init":
        return _stack(
            ("<module>", USER, 212),
            ("main", USER, 198),
            ("setup_groups", USER, 52),
            *(("setup", f"{PL}/strategies/ddp.py", 150 + k) for k in range(30)),
            ("wrapper", LOGGER, 95),
            ("new_group", C10D, 4870),
            ("_new_group_with_tag", C10D, 5030),
            ("_store_based_barrier", C10D, 4410),
        )
    if role == "cleanup":
        return _stack(
            *_TRUNK[:3],
            ("__exit__", USER, 120),
            *(("teardown", f"{PL}/strategies/ddp.py", 400 + k) for k in range(33)),
            ("destroy_process_group", C10D, 2101),
        )
    if role == "save":
        return _stack(
            *_TRUNK[:12],
            ("on_train_batch_end", USER, 131),
            *(("save_checkpoint", f"{PL}/trainer/connectors/checkpoint_connector.py", 300 + k) for k in range(20)),
            ("save_checkpoint", USER, 140),
            *_BARRIER,
        )
    if role == "busy":
        return _stack(*_TRUNK, *_forward(13, 101 + sample))  # 24 + 41 = 65 frames
    return _stack(*_TRUNK, *_STRATEGY, *_STEP, *_ALL_REDUCE)  # 36 frames


_STRATEGY = tuple(("_call_strategy_hook", f"{PL}/trainer/call.py", 300 + k) for k in range(8))


def _role(scenario: str, rank: int, world: int) -> str:
    middle_node = (world // RANKS_PER_NODE) // 2
    if scenario == "collective_mismatch" and rank // RANKS_PER_NODE == middle_node:
        return "save"
    if scenario == "straggler" and rank == world // 2:
        return "busy"
    if scenario == "cleanup_deadlock" and rank >= world // 2:
        return "cleanup"
    if scenario == "init_deadlock":
        return "train" if rank // RANKS_PER_NODE == middle_node else "init"
    return "train"


def expected(world: int, scenario: str) -> tuple[Verdict, tuple[int, ...]]:
    """The verdict and culprit ranks the analysis must find for ``scenario`` at ``world``."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    node = (world // RANKS_PER_NODE) // 2
    node_ranks = tuple(r for r in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE) if r < world)
    return {
        "nccl_timeout": (Verdict.NCCL_TIMEOUT, ()),
        "collective_mismatch": (Verdict.COLLECTIVE_MISMATCH, node_ranks),
        "straggler": (Verdict.STRAGGLER, (world // 2,)),
        "cleanup_deadlock": (Verdict.CLEANUP_DEADLOCK, tuple(range(world // 2, world))),
        "init_deadlock": (Verdict.INIT_DEADLOCK, node_ranks),
        "rank_missing": (Verdict.RANK_MISSING, (world // 2,)),
    }[scenario]


# ----------------------------------------------------------------- side threads

_THREAD = (
    ("_bootstrap", f"{STDLIB}/threading.py", 1002),
    ("_bootstrap_inner", f"{STDLIB}/threading.py", 1045),
    ("run", f"{STDLIB}/threading.py", 982),
)
_WAIT = ("wait", f"{STDLIB}/threading.py", 331)


def _side_threads(rank: int) -> tuple[tuple[str, Stack], ...]:
    """The other threads of ``rank`` (3 to 11 of them), named as Python names them.

    Where each one stands varies by rank (a data-loader thread mid-batch at one of 40
    lines, a logger at one of 16, ...), which gives the job a few hundred distinct stacks.
    """
    return _threads_at(rank % 40, (rank // 40) % 5, rank % 16, rank % 8, rank % 24, rank % 9)


@functools.cache
def _threads_at(
    item: int, codec: int, monitor: int, pool: int, flush: int, extra: int
) -> tuple[tuple[str, Stack], ...]:
    threads: list[tuple[str, Stack]] = [
        ("pt_autograd_0", _stack(*_THREAD, ("_engine_loop", f"{SITE}/torch/autograd/graph.py", 60))),
        (
            "Thread-1 (_pin_memory_loop)",
            _stack(
                *_THREAD,
                ("_pin_memory_loop", f"{SITE}/torch/utils/data/_utils/pin_memory.py", 54),
                ("do_one_step", f"{SITE}/torch/utils/data/_utils/pin_memory.py", 31),
                ("get", f"{STDLIB}/multiprocessing/queues.py", 113),
                ("poll", f"{STDLIB}/multiprocessing/connection.py", 257),
                ("_poll", f"{STDLIB}/multiprocessing/connection.py", 440),
                ("wait", f"{STDLIB}/multiprocessing/connection.py", 1136),
                ("select", f"{STDLIB}/selectors.py", 415),
            ),
        ),
        (
            "Thread-2 (prefetch)",
            _stack(
                *_THREAD,
                ("prefetch", USER, 30),
                ("__getitem__", "/workspace/llm/data.py", 70 + item),
                ("decode", "/workspace/llm/data.py", 20 + codec),
            ),
        ),
    ]
    kinds = [
        (
            "QueueFeederThread",
            _stack(
                *_THREAD, ("_feed", f"{STDLIB}/multiprocessing/queues.py", 231), ("wait", f"{STDLIB}/threading.py", 327)
            ),
        ),
        (
            "Thread-3 (_monitor)",
            _stack(*_THREAD, ("_monitor", f"{SITE}/wandb/sdk/internal/system.py", 90 + monitor), _WAIT),
        ),
        (
            "ThreadPoolExecutor-0_0",
            _stack(
                *_THREAD,
                ("_worker", f"{STDLIB}/concurrent/futures/thread.py", 81),
                ("get", f"{STDLIB}/queue.py", 171),
                _WAIT,
            ),
        ),
        (
            "ThreadPoolExecutor-0_1",
            _stack(
                *_THREAD,
                ("_worker", f"{STDLIB}/concurrent/futures/thread.py", 81),
                ("get", f"{STDLIB}/queue.py", 180 + pool),
                _WAIT,
            ),
        ),
        ("Thread-4 (_heartbeat)", _stack(*_THREAD, ("_heartbeat", USER, 20), ("sleep", "<built-in>", 0))),
        (
            "Thread-5 (flush)",
            _stack(
                *_THREAD, ("flush_loop", f"{SITE}/tensorboard/summary/writer/event_file_writer.py", 240 + flush), _WAIT
            ),
        ),
        ("Thread-6 (_check_timeout)", _stack(*_THREAD, ("_check_timeout", USER, 45), _WAIT)),
        (
            "Thread-7 (checkpoint_io)",
            _stack(
                *_THREAD,
                ("_io_loop", f"{PL}/plugins/io/async_plugin.py", 60),
                ("get", f"{STDLIB}/queue.py", 171),
                _WAIT,
            ),
        ),
        (
            "Thread-8 (_serve)",
            _stack(
                *_THREAD, ("serve_forever", f"{STDLIB}/socketserver.py", 233), ("select", f"{STDLIB}/selectors.py", 415)
            ),
        ),
    ]
    return tuple(threads + kinds[:extra])  # 0 to 8 more: 4 to 12 threads a rank in all


# ------------------------------------------------------------------ processes

_ENV_FIXED = (
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
    ("MASTER_ADDR", "10.0.0.1"),
    ("MASTER_PORT", "29500"),
    ("NCCL_ASYNC_ERROR_HANDLING", "1"),
    ("NCCL_DEBUG", "WARN"),
    ("NCCL_IB_HCA", "mlx5"),
    ("NCCL_SOCKET_IFNAME", "eth0"),
    ("OMP_NUM_THREADS", "8"),
    ("PYTHONUNBUFFERED", "1"),
    ("TORCHELASTIC_RUN_ID", "llm-pretrain-42"),
    ("TORCH_NCCL_BLOCKING_WAIT", "0"),
)


def _process(rank: int, world: int) -> RankProcess:
    node, local = divmod(rank, RANKS_PER_NODE)
    env = dict(_ENV_FIXED)
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(RANKS_PER_NODE),
            "GROUP_RANK": str(node),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        }
    )
    pid = 40_000 + 37 * local + node % 1000
    return RankProcess(
        pid=pid,
        host=f"node{node:05d}",
        rank=rank,
        rank_source=RankSource.ENV,
        rank_evidence=f"RANK={rank}",
        world_size=world,
        local_rank=local,
        cmdline=("/opt/venv/bin/python", "-u", USER, "--config", "llm.yaml"),
        env=tuple(sorted(env.items())),
        launcher_pid=39_990 + node % 1000,
    )


def _rank(scenario: str, rank: int, world: int, samples: int) -> RankSnapshot:
    process = _process(rank, world)
    busy = _role(scenario, rank, world) == "busy"
    base = 0x7F00_0000_0000 + 0x1000 * rank
    side = tuple(
        ThreadStack(base + 0x100 * (k + 1), name, stack, process.pid + k + 1)
        for k, (name, stack) in enumerate(_side_threads(rank))
    )
    taken: list[Sample] = []
    for i in range(samples):
        main = ThreadStack(base, "MainThread", _main_stack(scenario, rank, world, i), process.pid, busy, busy)
        last = taken[-1].threads if taken else None
        threads = last if last is not None and last[0] == main else (main, *side)
        cpu = 120.0 + (1.2 * i if busy else 0.0)  # a waiting rank's counters stand still
        state = ProcessState(
            status="running" if busy else "sleeping",
            cpu_seconds=cpu,
            num_threads=len(threads) + 20,
            read_chars=9_000_000,
            write_chars=400_000,
            ctx_switches=5_000 + (40 * i if busy else 0),
            rss_bytes=6 * 2**30,
        )
        taken.append(Sample(t=round(i * INTERVAL, 6), threads=tuple(threads), state=state))
    return RankSnapshot(process=process, samples=tuple(taken))


def synthetic_snapshot(world: int, scenario: str = "collective_mismatch", *, samples: int = SAMPLES) -> JobSnapshot:
    """A snapshot of a ``world``-rank job hung as ``scenario`` says (see the module doc)."""
    expected(world, scenario)  # checks the scenario's name
    if world < 3 * RANKS_PER_NODE:  # one node of two would be no minority
        raise ValueError(f"a synthetic job has at least {3 * RANKS_PER_NODE} ranks (three nodes)")
    missing = {world // 2} if scenario == "rank_missing" else set()
    collecting = gc.isenabled()
    gc.disable()  # millions of new objects, none of them garbage: collections would only scan
    try:
        ranks = tuple(_rank(scenario, r, world, samples) for r in range(world) if r not in missing)
    finally:
        if collecting:
            gc.enable()
    return JobSnapshot(
        spec="10.0.0.1:29500",
        ranks=ranks,
        world_size=world,
        window_seconds=round((samples - 1) * INTERVAL, 6),
        captured_at="2025-06-01T12:00:00Z",
        hangdoc_version="synthetic",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a synthetic snapshot bundle (see the module doc).")
    parser.add_argument("--ranks", type=int, default=10_000, help="world size (default 10000)")
    parser.add_argument("--scenario", choices=SCENARIOS, default="collective_mismatch")
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--out", required=True, help="bundle path (.json.gz: compressed)")
    parser.add_argument(
        "--schema-version", type=int, choices=(1, 2), default=2, help="bundle format (1: the first; default 2)"
    )
    args = parser.parse_args(argv)
    import gzip
    import json
    import time

    from hangdoc.bundle import save_snapshot, snapshot_to_dict

    t0 = time.perf_counter()
    snapshot = synthetic_snapshot(args.ranks, args.scenario, samples=args.samples)
    t1 = time.perf_counter()
    if args.schema_version == 2:
        save_snapshot(snapshot, args.out)  # as ``hangdoc diagnose --save`` writes it
    else:
        text = json.dumps(snapshot_to_dict(snapshot, schema_version=1)).encode()
        Path(args.out).write_bytes(gzip.compress(text, mtime=0) if args.out.endswith(".gz") else text)
    t2 = time.perf_counter()
    verdict, culprits = expected(args.ranks, args.scenario)
    print(
        f"{args.out}: {args.ranks} ranks, expect {verdict.value} culprits {list(culprits)[:16]} "
        f"(built in {t1 - t0:.2f} s, saved in {t2 - t1:.2f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
