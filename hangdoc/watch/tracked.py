"""The job's rank processes as found through its nodes: the attached job, and the ranks of
a wrapped job named with ``--job`` and ``--agents``.

They are looked for at the start and again every ``FLEET_REFRESH`` seconds, because
restarted workers get new pids and ranks start late: through the nodes, or through the
``finder`` of a fleet source the watch holds (a ``ray:`` job's, which places agents as
workers appear on new nodes). An attached job has ended when every node answered and none
has a rank any more, and the job is not known to be running still. ``TrackedRanks`` also reads their heartbeats,
samples their stacks when nothing else shows activity, and names the process trees of
the job on this node (what ``--on-hang kill`` ends).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..capture.find.jobspec import parse_job_spec
from ..errors import HangdocError, JobNotFound
from ..fleet.coordinator import Fleet, find_ranks
from ..fleet.node import LocalNode, Node
from ..model import Heartbeat
from ..pipeline import FleetFinder, Message
from .activity import StackSampler, fleet_heartbeats
from .config import Level, Say, messages

FLEET_REFRESH = 10.0  # seconds between looks for restarted or ended ranks


class TrackedRanks:
    """The job's ranks on ``nodes``, looked for again every ``FLEET_REFRESH`` seconds."""

    def __init__(self, nodes: Sequence[Node], job: str, timeout: float, say: Say, sample: bool = False) -> None:
        self.nodes = nodes
        self.job = job  # the job spec
        self.timeout = timeout  # for each node's answer; a search gets 10 s more
        self.say = say
        self.sample = sample  # sample their stacks: the job gives no other activity
        self.fleet: Fleet | None = None
        self.sampler: StackSampler | None = None
        self.checked = -FLEET_REFRESH  # when they were last looked for
        self.finder: FleetFinder | None = None  # set while the watch holds a fleet source
        self.absent = False  # the last search found a running job without ranks (said once)

    def find(self) -> Fleet:
        """The first search; raises ``JobNotFound`` when no node has a rank."""
        self.fleet = self._search(messages(self.say))
        return self.fleet

    def _search(self, say: Message) -> Fleet:
        job = parse_job_spec(self.job)
        if self.finder is not None:
            return self.finder(job, say)
        return find_ranks(self.nodes, job, deadline=self.timeout + 10.0)

    def start(self) -> None:
        """Start sampling stacks (when asked to), and the time to the next search."""
        assert self.fleet is not None
        if self.sample:
            self.sampler = StackSampler(self.fleet, self.timeout)
        self.checked = time.monotonic()

    def due(self) -> bool:
        """Time for another search; if so, the time to the one after starts now."""
        if time.monotonic() - self.checked < FLEET_REFRESH:
            return False
        self.checked = time.monotonic()
        return True

    def gone(self) -> bool:
        """Whether the attached job ended: looked for again when due, or at once when the
        sampled stacks show every rank gone."""
        if (self.sampler is not None and self.sampler.all_gone) or self.due():
            return self.refresh()
        return False

    def refresh(self) -> bool:
        """Look for the job's ranks again (restarted workers get new pids). True only when
        every node answered and none has a rank: an agent that is down is not a job that
        ended, nor is a job that its scheduler says is running (its workers restarting)."""
        try:
            fleet = self._search(lambda _message: None)
        except JobNotFound as err:
            if err.unreachable:
                self.say(Level.ERROR, f"could not look for the job's ranks on {err.unreachable[0]}")
            elif err.running and not self.absent:
                self.say(Level.INFO, f"no rank process now, the job still runs: {err}; watching for its ranks")
            self.absent = err.running
            return not err.unreachable and not err.running
        except HangdocError as err:  # no node answered at all
            self.say(Level.ERROR, f"could not look for the job's ranks: {err}")
            return False
        self.absent = False
        if self.fleet is None or {p.pid for p in fleet.procs} != {p.pid for p in self.fleet.procs}:
            self.fleet = fleet
            if self.sampler is not None:
                self.sampler = StackSampler(fleet, self.timeout)
        return False

    def heartbeats(self) -> dict[tuple[str, int], Heartbeat]:
        """Every rank's last heartbeat, by (node name, pid)."""
        return fleet_heartbeats(self.fleet, self.timeout) if self.fleet else {}

    def where_is(self) -> dict[tuple[str, int], tuple[int | None, str]]:
        """Each rank's (rank, host), by (node name, pid)."""
        return {(node.name, p.pid): (p.rank, p.host) for node, p in self.fleet.placed} if self.fleet else {}

    def roots(self) -> list[int]:
        """The ranks on this node and their launchers: the process trees of the job here."""
        roots: set[int] = set()
        for node, proc in self.fleet.placed if self.fleet else []:
            if isinstance(node, LocalNode):
                roots.add(proc.pid)
                if proc.launcher_pid:
                    roots.add(proc.launcher_pid)
        return sorted(roots)
