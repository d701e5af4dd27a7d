"""``hangdoc incidents``: a server's incidents, fetched from its API and shown as a table."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..errors import HangdocError, UsageError
from ..rankranges import ranges_text


class ServerError(HangdocError):
    """The server could not be reached, or refused."""

    exit_code = 7
    help = "Check --server (or HANGDOC_SERVER), that `hangdoc server` runs there, and --token-file."


def fetch_incidents(
    server: str,
    token: str | None,
    ca: str | None,
    job: str | None,
    verdict: str | None,
    since: str | None,
    limit: int,
) -> dict[str, Any]:
    base = server.rstrip("/")
    if "://" not in base:
        base = f"{'https' if ca else 'http'}://{base}"
    if not base.startswith(("http://", "https://")):
        raise UsageError(f"--server {server!r} is not an http(s) URL")
    query = {k: v for k, v in {"job": job, "verdict": verdict, "since": since, "limit": str(limit)}.items() if v}
    request = urllib.request.Request(f"{base}/api/incidents?{urllib.parse.urlencode(query)}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca) if base.startswith("https://") else None
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise ServerError(f"{base} answered {err.code}: {_error_of(err)}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ServerError(f"cannot reach {base}: {getattr(err, 'reason', err)}") from None
    except ValueError:
        raise ServerError(f"{base} did not answer JSON: is it a hangdoc server?") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("incidents"), list):
        raise ServerError(f"{base} did not answer a list of incidents: is it a hangdoc server?")
    return answer


def _error_of(err: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(err.read(65536))
        return str(body.get("error", err.reason))
    except (ValueError, AttributeError, OSError):
        return str(err.reason)


def render_incidents(answer: dict[str, Any]) -> str:
    incidents = answer["incidents"]
    if not incidents:
        return "no incident\n"
    rows = [("ID", "STATE", "VERDICT", "JOB", "CULPRITS", "DETECTED", "SEEN BEFORE", "SUMMARY")]
    for inc in incidents:
        culprits = inc.get("culprit_ranks") or []
        seen = inc.get("seen_before") or []
        rows.append(
            (
                str(inc.get("id", "")),
                str(inc.get("state", "")),
                str(inc.get("verdict", "")),
                str(inc.get("job", "")),
                ranges_text(culprits) if culprits else "-",
                str(inc.get("detected_at", "")),
                ", ".join(f"#{i}" for i in seen) if seen else "-",
                str(inc.get("summary", "")),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"
