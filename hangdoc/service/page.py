"""The server's page (``GET /``) for whoever is on call: what is hung now, what was, which
jobs and agents the server sees. One self-contained HTML document: no script, no asset
fetched, every value escaped (job names and summaries come from the jobs). And the page
that says how to give the token (``render_unauthorized``).
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence

from .. import __version__
from ..errors import one_line, printable
from ..rankranges import short_ranges
from .metrics import agent_live
from .records import AgentView, Incident, IncidentState, JobState, JobView

STALE_AFTER = 90.0  # seconds without a report after which an agent is shown stale
SUMMARY_CHARS = 300  # a summary is cut to this on the page; the report has it whole

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2430;color:#fff;padding:14px 24px}
header h1{font-size:18px;margin:0 0 6px}
.counts span{margin-right:22px}.counts b{font-size:20px;margin-right:4px}
main{padding:8px 24px 32px}
h2{font-size:16px;margin:22px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff;box-shadow:0 1px 2px #0002}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #e3e6ea;vertical-align:top}
th{background:#eef0f3;font-weight:600;white-space:nowrap}
td.num,td.when,td.nw{white-space:nowrap}
td.summary{overflow-wrap:anywhere;min-width:14em}
.age{color:#5b6472;font-size:12px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff}
.hung{background:#c62828}.suspected{background:#ef8f00}.resumed{background:#2e7d32}
.running{background:#2e7d32}.ended,.dismissed,.stale{background:#78808c}.live{background:#2e7d32}
.empty{background:#fff;padding:14px;color:#5b6472;box-shadow:0 1px 2px #0002}
.err{color:#c62828}
footer{color:#5b6472;font-size:12px;padding:0 24px 20px}
"""
_HEAD = (
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'\">\n"
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    "<title>{title}</title>\n<style>{style}</style>\n</head>\n<body>\n"
)


def render_index(
    incidents: Sequence[Incident],
    seen_before: Mapping[int, Sequence[int]],
    jobs: Sequence[JobView],
    agents: Sequence[AgentView],
    now: float,
    stale_after: float = STALE_AFTER,
    open_count: int | None = None,
) -> str:
    """The page: counts, the incidents newest first, the jobs, the agents.

    ``seen_before``: for an incident's id, the ids of the earlier incidents with its
    fingerprint (any order); ``now``: epoch seconds, for the ages; ``open_count``: the open
    incidents in all (when ``incidents`` is only the newest), else counted in ``incidents``."""
    if open_count is None:
        open_count = sum(1 for i in incidents if i.state is IncidentState.HUNG)
    live = sum(1 for a in agents if agent_live(a, now, stale_after))
    counts = (
        f'<div class="counts"><span id="open-count"><b>{open_count}</b>open incident{_s(open_count)}</span>'
        f'<span id="job-count"><b>{len(jobs)}</b>job{_s(len(jobs))} watched</span>'
        f'<span id="agent-count"><b>{live}</b>of {len(agents)} agent{_s(len(agents))} live</span></div>'
    )
    return "".join(
        [
            _HEAD.format(title=_e(f"hangdoc: {open_count} open"), style=_STYLE),
            f"<header><h1>hangdoc server</h1>{counts}</header>\n<main>\n",
            "<h2>Incidents</h2>\n",
            _incidents(incidents, seen_before, now) if incidents else _empty_incidents(jobs, agents),
            "<h2>Jobs</h2>\n",
            _jobs(jobs, now) if jobs else _empty("jobs-empty", _no_jobs(agents)),
            "<h2>Agents</h2>\n",
            _agents(agents, now, stale_after)
            if agents
            else _empty(
                "agents-empty",
                "no agent known yet: agents appear when they report to this server or when the "
                "server is started with their addresses to poll",
            ),
            f"</main>\n<footer>hangdoc {_e(__version__)} · shown at {_e(_when(now))}</footer>\n</body></html>\n",
        ]
    )


def render_unauthorized() -> str:
    """The page a browser gets without the token: how to give it."""
    return "".join(
        [
            _HEAD.format(title="hangdoc: token needed", style=_STYLE),
            "<header><h1>hangdoc server: token needed</h1></header>\n<main>\n",
            '<div class="empty" id="unauthorized"><p>This server answers only with its token.</p>',
            "<p>In a browser, open <code>/?token=TOKEN</code> once, with the token the server "
            "was started with: the browser keeps it in a cookie for 12 hours and the address "
            "bar loses it.</p>",
            "<p>From a script, send the header <code>Authorization: Bearer TOKEN</code>.</p></div>\n",
            "</main>\n</body></html>\n",
        ]
    )


# ------------------------------------------------------------------ the tables


def _incidents(incidents: Sequence[Incident], seen_before: Mapping[int, Sequence[int]], now: float) -> str:
    rows = []
    for i in incidents:
        earlier = seen_before.get(i.id, ())
        seen = (
            f'<a href="/incidents/{min(earlier)}" title="the earliest with this fingerprint">'
            f"seen before ×{len(earlier)}</a>"
            if earlier
            else "first seen"
        )
        rows.append(
            f'<tr id="incident-{i.id}"><td class="num">{i.id}</td>'
            f"<td>{_badge(i.state.value)}</td>"
            f'<td class="verdict">{_e(i.verdict)}</td>'
            f'<td class="job">{_e(i.job)}</td>'
            f'<td class="num">{_e(short_ranges(sorted(set(i.culprits)))) or "—"}</td>'
            f'<td class="summary">{_e(one_line(i.summary, SUMMARY_CHARS))}</td>'
            f'<td class="when">{_e(_when(i.detected_at))}<br><span class="age">{_e(_age(now - i.detected_at))}'
            f" ago</span></td>"
            f'<td class="nw">{seen}</td>'
            f'<td class="nw"><a class="report" href="/incidents/{i.id}">report</a> · '
            f'<a class="snapshot" href="/incidents/{i.id}/snapshot.json.gz">snapshot</a></td></tr>\n'
        )
    return _table(
        "incidents",
        ("id", "state", "verdict", "job", "culprit ranks", "summary", "detected", "history", "evidence"),
        rows,
    )


def _jobs(jobs: Sequence[JobView], now: float) -> str:
    rows = []
    for job in jobs:
        ranks = sorted({r for n in job.nodes for r in n.ranks})
        seen = short_ranges(ranks) if ranks else "none"
        of = f" of {job.world_size}" if job.world_size is not None else ""
        incident = f' · <a href="/incidents/{job.incident}">incident {job.incident}</a>' if job.incident else ""
        nodes = ", ".join(n.node for n in job.nodes)
        rows.append(
            f'<tr><td class="job">{_e(job.job)}</td><td>{_badge(job.state.value)}{incident}</td>'
            f'<td>{_e(nodes) or "—"}</td><td class="num">{_e(seen)}{_e(of)} ({len(ranks)})</td>'
            f'<td class="num">{_e(_age(job.still_for))}</td></tr>\n'
        )
    return _table("jobs", ("job", "state", "nodes", "ranks seen", "still for"), rows)


def _agents(agents: Sequence[AgentView], now: float, stale_after: float) -> str:
    rows = []
    for a in agents:
        state = "live" if agent_live(a, now, stale_after) else "stale"
        last = f"{_age(now - a.last_report)} ago" if a.last_report is not None else "never"
        error = f'<span class="err">{_e(one_line(a.error, SUMMARY_CHARS))}</span>' if a.error else ""
        rows.append(
            f"<tr><td>{_e(a.address)}</td><td>{_e(a.node)}</td>"
            f"<td>{'registered' if a.registered else 'polled'}</td>"
            f'<td class="when">{_badge(state)} {_e(last)}</td><td>{error}</td></tr>\n'
        )
    return _table("agents", ("address", "node", "how", "last report", "error"), rows)


def _empty_incidents(jobs: Sequence[JobView], agents: Sequence[AgentView]) -> str:
    suspected = sum(1 for j in jobs if j.state is JobState.SUSPECTED)
    being = f"; {suspected} being diagnosed now" if suspected else ""
    return _empty(
        "incidents-empty",
        f"no incident yet: the server watches {len(jobs)} job{_s(len(jobs))} "
        f"on {len(agents)} agent{_s(len(agents))}{being}",
    )


def _no_jobs(agents: Sequence[AgentView]) -> str:
    if not agents:
        return "no job seen: no agent is known yet"
    return f"no job seen: none of the {len(agents)} agent{_s(len(agents))} has reported a rank process"


def _table(ident: str, headings: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headings)
    return f'<table id="{ident}"><thead><tr>{head}</tr></thead>\n<tbody>\n{"".join(rows)}</tbody></table>\n'


def _empty(ident: str, words: str) -> str:
    return f'<p class="empty" id="{ident}">{_e(words)}</p>\n'


def _badge(state: str) -> str:
    return f'<span class="badge {_e(state)}">{_e(state)}</span>'


def _e(text: str) -> str:
    return html.escape(printable(text), quote=True)


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _age(seconds: float) -> str:
    """``42 s``, ``7 min``, ``3 h 5 min``, ``2 d 4 h``."""
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"
