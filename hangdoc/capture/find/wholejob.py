"""From one part of a job to the whole of it: on this node, and where the rest runs.

``pid:PID`` of one rank names its whole job. ``job_here`` takes in the processes of this
node that share the named ranks' rendezvous and user:

1. the rendezvous key the ranks carry (``jobsplit``): ``MASTER_ADDR``/``MASTER_PORT`` (any
   name of the same host), else the Slurm step, else the torchelastic run;
2. without one, ranks inferred as the children of one Python parent (``mp.spawn`` started
   by hand, a launcher that is itself rank 0): that parent and its descendants (the same
   launcher).

Only the named ranks' user's processes are taken in (``owners``: for ``pid:PID`` the job
is its user's): another user's process that names the same rendezvous is never a rank of
it, and is named in ``others``. Where another user listens on the job's ``MASTER_PORT``
(``owners`` rule 1: the job is that user's), the named ranks are not the job's own, and
nothing is widened.

``elsewhere`` reads, from the ranks' own environment, that the job also runs on other nodes
(``LOCAL_WORLD_SIZE`` below ``WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``/``SLURM_NODEID``
past 0, ``GROUP_WORLD_SIZE``/``NNODES``/``SLURM_NNODES`` above 1) and which ones;
``elsewhere_note`` says it once for all the nodes asked, with the command lines that bring
the rest in: an agent on each node, and the diagnosis that asks them.
A world larger than the ranks found, alone, proves nothing: those ranks may be missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...model import RankSource, counted
from ...rankranges import rank_phrase
from .hosts import same_host
from .jobsplit import RendezvousKey, rendezvous_key
from .owners import listening_uids
from .processes import ProcessTable, is_python
from .rankenv import parse_env_int
from .rankselect import FoundRank

AGENT_PORT = 7420  # `hangdoc agent`'s default port (cli: --listen 127.0.0.1:7420)
_NODES_SHOWN = 16  # nodes named in the command line before "..."
_NODELIST_PART = re.compile(r"([A-Za-z0-9_.-]*)\[([0-9,\-]+)\]([A-Za-z0-9_.-]*)|([A-Za-z0-9_.-]+)")
_PLAIN_NODE = re.compile(r"[A-Za-z0-9_.:-]{1,253}")


@dataclass(frozen=True)
class JobHere:
    """The processes of one job on this node, and how a note names the job."""

    pids: tuple[int, ...]
    name: str  # "the job at 127.0.0.1:29500", "the job slurm:77.0", "the job of pid 40"
    spec: str | None  # the job spec that names it alone, where one does
    others: tuple[int, ...] = ()  # Python processes of other users in the rendezvous


def job_here(table: ProcessTable, ranks: Sequence[FoundRank]) -> JobHere | None:
    """The processes of the job that ``ranks`` (found through a ``pid:``) belong to, of their
    user; None when nothing names one job (several rendezvous, several parents, several
    users, or none)."""
    uids = {r.proc.uid for r in ranks}
    if len(uids) != 1:
        return None
    (uid,) = uids
    keys = {rendezvous_key(r.proc.env) for r in ranks}
    keys.discard(None)
    if len(keys) > 1:
        return None
    if keys:
        (key,) = keys
        assert key is not None
        inside = [p for p in table.procs.values() if _in_rendezvous(p.env, key)]
        others = tuple(p.pid for p in inside if p.uid != uid and is_python(p))
        port = dict(zip(key.variables, key.values, strict=False)).get("MASTER_PORT", "")
        if others and port.isdigit() and (held := listening_uids(int(port))) and uid not in held:
            return None  # the job is the listener's (owners, rule 1), not the named ranks'
        spec = key.spec()
        return JobHere(
            tuple(p.pid for p in inside if p.uid == uid),
            f"the job at {spec}" if spec and not spec.startswith("slurm:") else f"the job {spec or key}",
            spec,
            others,
        )
    parents = {r.proc.ppid for r in ranks}
    if len(parents) != 1 or any(r.source is not RankSource.INFERRED for r in ranks):
        return None
    (ppid,) = parents
    parent = table.procs.get(ppid)
    if parent is None or parent.uid != uid or not is_python(parent):
        return None
    pids = (ppid, *(p.pid for p in table.descendants(ppid) if p.uid == uid))
    return JobHere(pids, f"the job of pid {ppid}", f"pid:{ppid}")


def _in_rendezvous(env: Mapping[str, str] | None, key: RendezvousKey) -> bool:
    """``env`` names the rendezvous ``key``: the endpoint by any name of its host, the Slurm
    step or the torchelastic run (whatever other key ``env`` would be filed under)."""
    if not env:
        return False
    names = dict(zip(key.variables, key.values, strict=False))
    if "MASTER_PORT" in names:
        return (
            env.get("MASTER_PORT", "").strip() == names["MASTER_PORT"]
            and bool(env.get("MASTER_ADDR", "").strip())
            and same_host(env["MASTER_ADDR"], names["MASTER_ADDR"])
        )
    if "SLURM_JOB_ID" in names:
        job = env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", "")).strip()
        step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip()
        return (job, step) == (names["SLURM_JOB_ID"], names["SLURM_STEP_ID"])
    return env.get("TORCHELASTIC_RUN_ID", "").strip() == names["TORCHELASTIC_RUN_ID"]


# ------------------------------------------------------------------ the other nodes


def _number(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return parse_env_int(name, value)[0] if value else None


def _spans_nodes(env: Mapping[str, str], world: int) -> str | None:
    """What in one rank's environment says the job runs on more than one node."""
    local = _number(env, "LOCAL_WORLD_SIZE")
    if local is not None and local < world:
        return f"LOCAL_WORLD_SIZE={local} of WORLD_SIZE={world}"
    for name in ("GROUP_WORLD_SIZE", "NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        count = _number(env, name)
        if count is not None and count > 1:
            return f"{name}={count}"
    for name in ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID"):
        index = _number(env, name)
        if index is not None and index > 0:
            return f"{name}={index}"
    return None


def _expand_nodelist(text: str) -> list[str] | None:
    """``node[01-03,07],gpu5`` as names; None for a form this does not read (nested
    brackets, several ranges in one name) or one of more than ``_NODES_SHOWN`` nodes."""
    names: list[str] = []
    position = 0
    while position < len(text):
        match = _NODELIST_PART.match(text, position)
        if match is None:
            return None
        prefix, ranges, suffix, plain = match.groups()
        if plain is not None:
            names.append(plain)
        else:
            for part in ranges.split(","):
                low, _, high = part.partition("-")
                if not low.isdigit() or (high and not high.isdigit()):
                    return None
                last = int(high) if high else int(low)
                if last - int(low) > _NODES_SHOWN:
                    return None
                names += [f"{prefix}{n:0{len(low)}d}{suffix}" for n in range(int(low), last + 1)]
        position = match.end()
        if position < len(text):
            if text[position] != ",":
                return None
            position += 1
        if len(names) > _NODES_SHOWN:
            return None
    return names


def _other_nodes(envs: Sequence[Mapping[str, str]], host: str) -> list[str]:
    """The job's other nodes where the environment names them: ``SLURM_JOB_NODELIST``
    (``SLURM_NODELIST``), else the node of ``MASTER_ADDR`` when it is not this one."""
    found: list[str] = []
    for env in envs:
        listed = env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")).strip()
        if listed and (names := _expand_nodelist(listed)):
            found += [n for n in names if not same_host(n, host)]
            break
    if not found:
        masters = {env.get("MASTER_ADDR", "").strip() for env in envs} - {""}
        if len(masters) == 1:
            (master,) = masters
            if _PLAIN_NODE.fullmatch(master) and not same_host(master, host):
                found.append(master)
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Elsewhere:
    """What one node's ranks say of the job's other nodes: why they show there are some,
    the nodes their environment names, and the spec that names the job on every node."""

    host: str
    why: str  # e.g. "LOCAL_WORLD_SIZE=2 of WORLD_SIZE=4"
    nodes: tuple[str, ...] = ()  # other nodes named by SLURM_JOB_NODELIST or MASTER_ADDR
    job: str | None = None  # "HOST:PORT" or "slurm:JOB.STEP" where the ranks name one


def _host_of(address: str) -> str:
    """The host of an agent address ``host:port`` or ``[v6]:port`` (a bare host as is)."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    host, colon, port = address.rpartition(":")
    return host if colon and port.isdigit() and ":" not in host else address


def elsewhere(ranks: Sequence[FoundRank], world: int | None, host: str) -> Elsewhere | None:
    """What the ranks' environment shows of the job's other nodes; None when it shows none
    (or the ranks found are the whole world)."""
    if world is None or len(ranks) >= world:
        return None
    envs = [r.proc.env for r in ranks if r.proc.env]
    why = next((w for env in envs if (w := _spans_nodes(env, world))), None)
    if why is None:
        return None
    keys = {rendezvous_key(env) for env in envs} - {None}
    key = keys.pop() if len(keys) == 1 else None
    job = key.spec() if key is not None else None
    return Elsewhere(host, why, tuple(_other_nodes(envs, host)), job)


def elsewhere_note(
    found: Sequence[Elsewhere],
    ranks: Sequence[int | None],
    world: int | None,
    asked: Sequence[str],
    spec: str,
    *,
    agents: bool,
) -> str | None:
    """One note for the whole job when the nodes asked hold fewer ranks than its world and
    their ranks say the job runs on other nodes, with the command lines that take those in;
    None when the ranks asked are the whole world. ``asked`` are the nodes that answered
    (agent addresses, or this host without agents); ``spec`` names the job where its ranks'
    rendezvous gives no spec of its own (a ``pid:`` never does on other nodes)."""
    if not found or world is None or len(set(ranks)) >= world:
        return None
    numbered = sorted({r for r in ranks if r is not None})
    here = rank_phrase(numbered) if numbered else counted(len(ranks), "rank", "ranks")
    why = found[0].why
    jobs = {e.job for e in found}
    named = jobs.pop() if len(jobs) == 1 else None
    job = named or spec
    if job.startswith("pid:"):
        job = "HOST:PORT"  # a pid names a process of this node only
    hosts = [e.host for e in found] + [_host_of(a) for a in asked]
    nodes = [n for n in dict.fromkeys(n for e in found for n in e.nodes) if not any(same_host(n, h) for h in hosts)]
    named = f" ({', '.join(nodes[:_NODES_SHOWN])})" if nodes else ""
    more = [f"{n}:{AGENT_PORT}" for n in nodes] or [f"NODE:{AGENT_PORT}", "..."]
    start = f"`hangdoc agent --listen 0.0.0.0:{AGENT_PORT} --token-file FILE`"
    if agents:
        shown = ",".join([*asked, *more][: _NODES_SHOWN + 1])
        return (
            f"{here} of {world} are on the nodes asked ({', '.join(asked)}) and {why}: "
            f"the others run on other nodes{named}, not asked. To take them in, run {start} "
            f"on those nodes, then add them: `hangdoc diagnose {job} --agents {shown} "
            "--token-file FILE` (or --hostfile FILE, one agent a line)"
        )
    host = found[0].host
    shown = ",".join([f"{host}:{AGENT_PORT}", *more][: _NODES_SHOWN + 1])
    return (
        f"{here} of {world} are on this node ({host}) and {why}: the others run on other "
        f"nodes{named}, not searched here. To take them in, run {start} on every node of "
        f"the job, this one too, then `hangdoc diagnose {job} --agents {shown} "
        "--token-file FILE` (or --hostfile FILE, one agent a line)"
    )
