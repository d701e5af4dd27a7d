"""hangdoc agents inside a Ray cluster: one actor per node, reached over the agent gRPC API.

``ray_agents(node_ids, token=...)`` places one ``HangdocAgent`` actor on each named Ray node
(``NodeAffinitySchedulingStrategy(node_id, soft=False)``, ``num_cpus=0``). Each actor serves
the ``hangdoc.v1.Agent`` API from a thread of its own process (``agent.serve_in_thread``) on
its node's IP at a free port, behind the caller's token, so the coordinator reaches it with
``client.RemoteNode`` exactly as it reaches a ``hangdoc agent``: one data model either way.
The block gets ``{node id: "IP:PORT"}``; on its way out the actors are killed (unless
``keep``), on errors and Ctrl-C too. A node whose agent cannot start, or does not answer
before the deadline, is reported with its reason instead of holding the diagnosis.

The caller is connected to Ray already (``ray.init(address=...)``); ``ray`` is imported
only when a function here runs, so hangdoc imports and works without Ray. The actor class
is named ``HangdocAgent``: Ray job discovery leaves actors of that class out of a job.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import string
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

from .. import __version__
from ..capture.find.ray_job import ADDRESS_ENV, NODE_ID_ENV
from ..errors import UsageError, one_line, shown
from ..model import counted
from .client import AgentError

NAMESPACE = "hangdoc"  # the Ray namespace of the agents' named actors
NAME_PREFIX = "hangdoc-agent-"
STOP_TIMEOUT = 15.0  # seconds to wait for killed actors to be gone
MIN_TOKEN_CHARS = 16


class RayAgentError(AgentError):
    """hangdoc agents could not be started on some Ray nodes."""

    help = (
        "Check that those nodes are alive (`ray list nodes`), that hangdoc (with py-spy) is "
        "installed in the Ray cluster's Python environment on every node, and see the "
        "HangdocAgent actor's log on that node (docs/ray.md)."
    )

    def __init__(self, message: str, help: str | None = None, failed: Mapping[str, str] | None = None) -> None:
        super().__init__(message, help)
        self.failed = dict(failed or {})  # node id -> why no agent runs there


class RayAgents(dict[str, str]):
    """``{node id: agent address "IP:PORT"}`` of the agents that started; ``info`` has what
    each said about itself (``HangdocAgent.info``), ``names`` its actor's name in
    ``NAMESPACE``, and ``failed`` ``{node id: reason}`` the nodes that have none (only with
    ``partial=True``)."""

    def __init__(
        self, started: Mapping[str, Mapping[str, Any]], failed: Mapping[str, str], names: Mapping[str, str]
    ) -> None:
        super().__init__({node_id: info["address"] for node_id, info in started.items()})
        self.info = {node_id: dict(info) for node_id, info in started.items()}
        self.failed = dict(failed)
        self.names = dict(names)


# ------------------------------------------------------------------ the actor, on a node


class HangdocAgent:
    """One hangdoc agent server inside this Ray actor's process, on the actor's node.

    Used as a Ray actor (``ray_agents`` wraps it with ``ray.remote``). It listens on the
    node's IP at a free port and accepts only calls that carry ``token``; it needs ptrace
    rights over the node's workers (docs/ray.md, "Agent privileges").
    """

    def __init__(self, token: str) -> None:
        import ray

        from .agent import AgentConfig, serve_in_thread

        _log_to_stderr()
        ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # ray: no annotations
        context = ray.get_runtime_context()
        self._node_id = context.get_node_id()
        # what the agent's discovery of ray:JOB reads (capture.find.ray_job.job_processes_here):
        # this node, and the cluster it belongs to
        os.environ[NODE_ID_ENV] = self._node_id
        os.environ[ADDRESS_ENV] = context.gcs_address
        self._address = ""
        self._error: str | None = None
        self._server = None
        if len(token) < MIN_TOKEN_CHARS:  # never an unauthenticated listener, even on loopback
            self._error = f"the agent's token has {len(token)} characters; at least {MIN_TOKEN_CHARS}"
            return
        try:
            self._server = serve_in_thread(AgentConfig(listen=_host_port(ip, 0), token=token))
        except Exception as exc:  # noqa: BLE001 - the caller gets the reason from info()
            self._error = f"the agent could not start on {ip}: {_reason(exc)}"
            return
        self._address = _host_port(ip, self._server.port)

    def info(self) -> dict[str, Any]:
        """Where the agent listens (``address`` "IP:PORT"), on which node (``node_id``, and
        ``raylet_pid``: the raylet whose workers are this node's, where one machine runs
        several), in which process, which hangdoc; ``error`` says why it does not listen
        (then ``address`` is empty)."""
        return {
            "address": self._address,
            "node_id": self._node_id,
            "pid": os.getpid(),
            "raylet_pid": _int(os.environ.get("RAY_RAYLET_PID")),
            "host": socket.gethostname(),
            "hangdoc_version": __version__,
            "error": self._error,
        }

    def stop(self) -> None:
        """Stop serving; the actor itself ends with ``ray.kill``."""
        if self._server is not None:
            self._server.stop()
            self._server = None


def _log_to_stderr() -> None:
    """The agent's start line and audit lines go to the actor's stderr (its Ray worker log)."""
    logger = logging.getLogger("hangdoc")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s hangdoc-agent %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


# ------------------------------------------------------------------ the caller's side


def _ray() -> Any:
    """The ``ray`` module of a process already connected to a cluster (never ``ray.init``
    here: an actor call without it would start a new local Ray instance)."""
    try:
        import ray
    except ImportError:
        raise UsageError("Ray is not installed here: pip install 'ray[default]'") from None
    if not ray.is_initialized():
        raise UsageError("not connected to a Ray cluster: ray.init(address=...) first")
    return ray


@cache
def _actor_class() -> Any:
    # max_restarts=0: an agent that died is reported, never silently replaced elsewhere
    return _ray().remote(num_cpus=0, max_restarts=0)(HangdocAgent)


@contextmanager
def ray_agents(
    node_ids: Iterable[str],
    *,
    token: str,
    keep: bool = False,
    start_timeout: float = 60.0,
    partial: bool = False,
) -> Iterator[RayAgents]:
    """One hangdoc agent per Ray node in ``node_ids`` for the block: ``{node id: "IP:PORT"}``.

    ``token`` (generated by the caller for this diagnosis) is what every call to the agents
    must carry (``client.AgentAuth(token=...)``). All agents must answer within
    ``start_timeout`` seconds; a node whose agent cannot start or is late raises
    ``RayAgentError`` naming each such node and why (its ``failed``), after removing the
    agents that did start. With ``partial=True`` the block runs with the agents that
    started, and the result's ``failed`` names the others. On leaving the block, also by an
    exception or Ctrl-C, every agent is killed and gone, unless ``keep`` (then they are
    detached actors named ``hangdoc-agent-...`` in namespace ``hangdoc``, which outlive
    this process: ``stop_ray_agents()`` removes them).
    """
    ray = _ray()
    if len(token) < MIN_TOKEN_CHARS:
        raise UsageError(f"the agents' token must have at least {MIN_TOKEN_CHARS} characters")
    actors: dict[str, Any] = {}
    names: dict[str, str] = {}
    failed: dict[str, str] = {}
    handed = False
    try:
        for node_id in dict.fromkeys(node_ids):
            try:
                names[node_id], actors[node_id] = _create(ray, node_id, token, keep)
            except Exception as exc:  # noqa: BLE001 - reported per node
                failed[node_id] = _reason(exc)
        started, late = _wait_ready(ray, actors, start_timeout)
        failed.update(late)
        _remove(ray, [actors.pop(n) for n in late])
        if failed and not partial:
            raise RayAgentError(_failure_message(failed, len(started) + len(failed)), failed=failed)
        handed = True
        yield RayAgents(started, failed, {n: names[n] for n in started})
    finally:
        if not (keep and handed):
            _remove(ray, list(actors.values()))


def _create(ray: Any, node_id: str, token: str, keep: bool) -> tuple[str, Any]:
    """Start one agent actor pinned to ``node_id``: (its name, its handle)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # checked here: Ray's own check logs a C++ error line for every malformed id
    if len(node_id) != 2 * ray.NodeID.size() or not all(c in string.hexdigits for c in node_id):
        raise UsageError(f"{shown(node_id)} is not a Ray node id (hex, as `ray list nodes` shows)")
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    name = f"{NAME_PREFIX}{node_id[:12]}-{secrets.token_hex(4)}"
    options: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "scheduling_strategy": strategy}
    if keep:
        options["lifetime"] = "detached"  # kept agents outlive this driver; else they die with it
    return name, _actor_class().options(**options).remote(token)


def _wait_ready(
    ray: Any, actors: Mapping[str, Any], timeout: float
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """({node id: its info} of the agents listening, {node id: reason} of the others)."""
    if not actors:
        return {}, {}
    refs = {actor.info.remote(): node_id for node_id, actor in actors.items()}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=max(timeout, 0.0))
    answers: dict[str, dict[str, Any] | str] = {}
    for ref in ready:
        try:
            answers[refs[ref]] = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the actor died or could not be placed
            answers[refs[ref]] = _reason(exc)
    started: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for node_id in actors:  # in the caller's order
        answer = answers.get(node_id, f"no agent answered within {timeout:g} s (is the node alive?)")
        if isinstance(answer, str):
            failed[node_id] = answer
        elif answer["error"]:
            failed[node_id] = answer["error"]
        elif answer["node_id"] != node_id:  # soft=False forbids it; never sample the wrong node
            failed[node_id] = f"the agent was placed on node {answer['node_id']}, not on this one"
        else:
            started[node_id] = answer
    return started, failed


def _failure_message(failed: Mapping[str, str], total: int) -> str:
    each = "; ".join(f"node {node_id}: {why}" for node_id, why in failed.items())
    return f"no hangdoc agent on {len(failed)} of {counted(total, 'Ray node')}: {each}"


def _remove(ray: Any, actors: list[Any], timeout: float = STOP_TIMEOUT) -> None:
    """Kill ``actors`` and wait (up to ``timeout``) until Ray reports each one dead."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001, S110 - already gone
            pass
    deadline = time.monotonic() + timeout
    alive = list(actors)
    while alive and time.monotonic() < deadline:
        refs = {actor.info.remote(): actor for actor in alive}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
        alive = [refs[ref] for ref in pending] + [refs[ref] for ref in ready if not _is_dead(ray, ref)]
        if alive:
            time.sleep(0.1)


def _is_dead(ray: Any, ref: Any) -> bool:
    """Whether a call to an actor failed because the actor is gone."""
    try:
        ray.get(ref)
    except ray.exceptions.ActorUnavailableError:
        return False
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError):
        return True
    return False


def stop_ray_agents(timeout: float = STOP_TIMEOUT) -> list[str]:
    """Kill every hangdoc agent actor left in the cluster (``keep=True``); their names."""
    ray = _ray()
    names = sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE and a["name"].startswith(NAME_PREFIX)
    )
    actors = []
    for name in names:
        try:
            actors.append(ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:
            continue  # gone meanwhile
    _remove(ray, actors, timeout)
    return names


def _reason(exc: BaseException) -> str:
    """One line saying why: the HangdocError or the first line of Ray's own message."""
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return one_line(first, 400)


__all__ = ["NAMESPACE", "HangdocAgent", "RayAgentError", "RayAgents", "ray_agents", "stop_ray_agents"]
