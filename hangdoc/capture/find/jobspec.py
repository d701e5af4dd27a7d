"""Parse the JOB argument: ``HOST:PORT``, ``pid:PID``, ``slurm:JOBID[.STEP]``, ``ray:JOB_ID``.

The forms are those of docs/user-guide.md, "Naming the job". Parsing is purely syntactic: whether a
host resolves or a pid exists is discovery's business (``hangdoc.discover``).

A malformed spec is a one-line ``UsageError`` that names the accepted forms and, where one
is near, the closest valid spec (``closest``): ``2282`` -> ``pid:2282``, ``pdi:2282`` ->
``pid:2282``, ``slurm 1234.0`` -> ``slurm:1234.0``, ``::1:29500`` -> ``[::1]:29500``. A
prefix one typo away from a scheme (``pdi:``, ``slrum:``) is taken for that typo, not for
a host name, when what follows fits the scheme; a host really called so is written with
a trailing dot (``pdi.:2282``).
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass

from ...digits import bounded_int
from ...errors import UsageError, shown
from ...model import PID_MAX, PID_MIN

ACCEPTED_FORMS = "HOST:PORT, [IPV6]:PORT, pid:PID, slurm:JOBID[.STEP] or ray:JOB_ID"

PORT_MIN, PORT_MAX = 1, 65535  # a job's MASTER_PORT
SPEC_MAX_CHARS = 1024  # a host name is at most 253 characters; anything longer is not a spec


# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
_IPV4_LIKE = re.compile(r"[0-9.]+")
# Slurm job ids: 1234, array tasks 1234_7, heterogeneous components 1234+1.
_SLURM = re.compile(r"(?P<job>\d+(?:_\d+|\+\d+)?)(?:\.(?P<step>\d+|batch|extern|interactive))?", re.ASCII)
# Ray job ids are hex ("02000000"), submission ids look like "raysubmit_AbC123".
_RAY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class JobKind(enum.Enum):
    """Which form of JOB was given."""

    ENDPOINT = "endpoint"  # HOST:PORT, the ranks' MASTER_ADDR/MASTER_PORT
    PID = "pid"  # a launcher or a rank on this node
    SLURM = "slurm"  # a Slurm job or job step
    RAY = "ray"  # a Ray job


@dataclass(frozen=True)
class JobSpec:
    """A parsed JOB; only the fields of its ``kind`` are set."""

    kind: JobKind
    raw: str
    host: str | None = None  # ENDPOINT; IPv6 without brackets
    port: int | None = None  # ENDPOINT
    pid: int | None = None  # PID
    slurm_job: str | None = None  # SLURM: "1234", "1234_7", "1234+1"
    slurm_step: str | None = None  # SLURM: "0", "batch", ... or None for the whole job
    ray_job: str | None = None  # RAY

    def __str__(self) -> str:
        """The canonical spelling, e.g. ``[::1]:29500`` or ``slurm:1234.0``."""
        if self.kind is JobKind.ENDPOINT:
            host = f"[{self.host}]" if self.host and ":" in self.host else self.host
            if host and _scheme_for(host) is not None:
                host += "."  # a host called pid (or pdi) stays a host when read back
            return f"{host}:{self.port}"
        if self.kind is JobKind.PID:
            return f"pid:{self.pid}"
        if self.kind is JobKind.SLURM:
            step = f".{self.slurm_step}" if self.slurm_step is not None else ""
            return f"slurm:{self.slurm_job}{step}"
        return f"ray:{self.ray_job}"

    @property
    def job_id(self) -> str:
        """The job as its scheduler names it (``{job}`` in ``--on-hang exec``): the Slurm job
        (and step) id, the Ray job id; other kinds have none but their spelling."""
        if self.kind is JobKind.SLURM:
            step = f".{self.slurm_step}" if self.slurm_step is not None else ""
            return f"{self.slurm_job}{step}"
        if self.kind is JobKind.RAY:
            return str(self.ray_job)
        return str(self)


def normalise_host(host: str) -> str:
    """A host as compared: no brackets around an IPv6 address, no trailing dot, lower case."""
    return host.strip().strip("[]").rstrip(".").lower()


def _malformed(text: str, reason: str) -> UsageError:
    return UsageError(f"bad job spec {shown(text)}: {reason}; expected {ACCEPTED_FORMS}")


def _with_suggestion(text: str, reason: str, suggestion: str, help_text: str | None = None) -> UsageError:
    return UsageError(
        f"bad job spec {shown(text)}: {reason}; did you mean {suggestion}? Expected {ACCEPTED_FORMS}", help=help_text
    )


def _parse_port(text: str, port: str) -> int:
    if bounded_int(port, PORT_MIN, PORT_MAX) is None:
        raise _malformed(text, f"port {shown(port)} is not a number from {PORT_MIN} to {PORT_MAX}")
    return int(port)


def _parse_endpoint(text: str) -> JobSpec:
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise _malformed(text, "a bracketed IPv6 address must be followed by :PORT")
        try:
            if not host.isascii():
                raise ValueError(host)
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _malformed(text, f"{shown(host)} is not an IPv6 address") from None
        return JobSpec(JobKind.ENDPOINT, text, host=host, port=_parse_port(text, port))
    if text.count(":") > 1:
        raise _malformed(text, "write IPv6 addresses in brackets, like [::1]:29500")
    host, sep, port = text.partition(":")
    if not sep or not host:
        raise _malformed(text, "not a known form")
    if _IPV4_LIKE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise _malformed(text, f"{shown(host)} is not an IPv4 address") from None
    elif not _HOSTNAME.fullmatch(host):
        raise _malformed(text, f"{shown(host)} is not a host name")
    return JobSpec(JobKind.ENDPOINT, text, host=host.rstrip(".").lower(), port=_parse_port(text, port))


def _parse_pid(text: str, value: str) -> JobSpec:
    if bounded_int(value, PID_MIN, PID_MAX) is None:
        raise _malformed(text, f"pid {shown(value)} is not a number from {PID_MIN} to {PID_MAX}")
    return JobSpec(JobKind.PID, text, pid=int(value))


def _parse_slurm(text: str, value: str) -> JobSpec:
    match = _SLURM.fullmatch(value)
    if not match:
        raise _malformed(text, f"{shown(value)} is not a Slurm JOBID or JOBID.STEP")
    return JobSpec(JobKind.SLURM, text, slurm_job=match["job"], slurm_step=match["step"])


def _parse_ray(text: str, value: str) -> JobSpec:
    if not _RAY.fullmatch(value):
        raise _malformed(text, f"{shown(value)} is not a Ray job id")
    return JobSpec(JobKind.RAY, text, ray_job=value)


def parse_job_spec(text: str) -> JobSpec:
    """Parse JOB; raise ``UsageError`` (one line naming the accepted forms and, when there
    is one, the closest valid spec) when malformed."""
    if len(text) > SPEC_MAX_CHARS:
        raise _malformed(text, f"longer than {SPEC_MAX_CHARS} characters")
    stripped = text.strip()
    if not stripped:
        raise _malformed(text, "empty")
    if not stripped.isprintable():
        raise _malformed(text, "it contains control characters or bytes that are not text")
    typo = _misspelt_scheme(stripped)
    if typo is not None:
        prefix = stripped.partition(":")[0]
        raise _with_suggestion(
            stripped,
            f"{shown(prefix)} is not a scheme",
            typo,
            f"A host really named {prefix}? Write it with a trailing dot: {prefix}.:{stripped.partition(':')[2]}",
        )
    try:
        return _parse(stripped)
    except UsageError as err:
        near = closest(stripped)
        if near is None:
            raise
        reason = near.reason or str(err).removeprefix(f"bad job spec {shown(stripped)}: ").removesuffix(
            f"; expected {ACCEPTED_FORMS}"
        )
        raise _with_suggestion(stripped, reason, near.spec, near.help) from None


def _parse(stripped: str) -> JobSpec:
    """``stripped`` (printable, not empty) as a spec, strictly: no suggestions."""
    prefix, sep, value = stripped.partition(":")
    prefix = prefix.lower()
    if sep and prefix == "pid":
        return _parse_pid(stripped, value)
    if sep and prefix == "slurm":
        return _parse_slurm(stripped, value)
    if sep and prefix == "ray":
        return _parse_ray(stripped, value)
    return _parse_endpoint(stripped)


# ------------------------------------------------------------------ the closest valid spec

SCHEMES = ("pid", "slurm", "ray")
# words people write for a scheme: tools and field names, not typos of it
_ALIASES = {
    "process": "pid",
    "proc": "pid",
    "ppid": "pid",
    "srun": "slurm",
    "sbatch": "slurm",
    "salloc": "slurm",
    "jobid": "slurm",
    "slurm_job_id": "slurm",
    "raysubmit": "ray",
}
_GLUED = re.compile(r"(?P<word>[A-Za-z_]+)\s*[\s=/#,;._-]\s*(?P<value>\S+)|(?P<word2>[A-Za-z]+)(?P<num>\d+)")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?P<rest>[^/]+)/*")
_BARE_SLURM = re.compile(r"\d+(?:_\d+|\+\d+)?\.(?:\d+|batch|extern|interactive)|\d+_\d+|\d+\+\d+", re.ASCII)
_RAY_ID = re.compile(r"[0-9a-f]{8,}|raysubmit_\w+", re.ASCII)  # what a real Ray job id looks like
_JUNK = " '\"<>#"  # around a value: quotes, spaces, a '#'
DEFAULT_MASTER_PORT = 29500  # torchrun's


@dataclass(frozen=True, slots=True)
class Suggestion:
    """A valid spec near a malformed one: why the text is not it, and a help line."""

    spec: str
    reason: str | None = None  # instead of the strict parser's reason
    help: str | None = None


def closest(text: str) -> Suggestion | None:
    """The valid spec nearest to the malformed ``text``, or None when nothing is near."""
    for near in _candidates(text.strip()):
        if near.spec == text:
            continue
        try:
            _parse(near.spec)
        except UsageError:
            continue
        return near
    return None


def _candidates(text: str) -> list[Suggestion]:
    """Specs ``text`` may have meant, most likely first; ``closest`` keeps the first valid one."""
    out: list[Suggestion] = []
    if text.lower().startswith("raysubmit_") or re.fullmatch(r"0[0-9a-f]{7}", text):
        out.append(Suggestion(f"ray:{text}", "a bare Ray job id"))  # 02000000: no pid starts with 0
    if text.isascii() and text.isdigit():  # 2282: a pid, most likely
        port = (
            f"If {text} is the ranks' MASTER_PORT, name their host too: HOST:{text} "
            f"(127.0.0.1:{text} for a job on this node)."
        )
        out.append(Suggestion(f"pid:{int(text)}", "a bare number", port if PORT_MIN <= int(text) <= PORT_MAX else None))
    if _BARE_SLURM.fullmatch(text):  # 1234.0, 1234_7
        out.append(Suggestion(f"slurm:{text}", "a bare Slurm job id"))
    url = _URL.fullmatch(text)
    if url:  # tcp://10.0.0.1:29500, env://...: the endpoint without the scheme
        out.append(Suggestion(url["rest"], "a URL, not HOST:PORT"))
    glued = _GLUED.fullmatch(text)
    if glued:  # pid 2282, pid=2282, pid2282, slurm/1234.0, process 42
        scheme = _scheme_for((glued["word"] or glued["word2"]).lower())
        if scheme is not None:
            out.append(Suggestion(f"{scheme}:{(glued['value'] or glued['num']).strip(_JUNK)}"))
    prefix, sep, value = text.partition(":")
    scheme = _scheme_for(prefix.lower())
    if sep and scheme is not None:  # pid: 2282, pid:'2282', pid:#2282
        out.append(Suggestion(f"{scheme}:{value.strip(_JUNK)}"))
    if text.count(":") > 1 and not text.startswith("[") and "://" not in text:  # ::1:29500
        host, _, port = text.rpartition(":")
        out.append(Suggestion(f"[{host}]:{port}"))
    if not sep and not text.isdigit() and _HOSTNAME.fullmatch(text):  # node01 -> node01:29500
        out.append(
            Suggestion(
                f"{text}:{DEFAULT_MASTER_PORT}",
                "a host without its port",
                f"HOST:PORT names the ranks' MASTER_ADDR and MASTER_PORT; "
                f"{DEFAULT_MASTER_PORT} is torchrun's default, use the job's own port.",
            )
        )
    if sep and not prefix and value:  # :29500
        out.append(
            Suggestion(
                f"127.0.0.1:{value}",
                "a port without its host",
                "HOST is the ranks' MASTER_ADDR (127.0.0.1 for a job on this node).",
            )
        )
    return out


def _scheme_for(word: str) -> str | None:
    """The scheme that ``word`` (lower case) is, misspells or stands for; None when none."""
    if word in SCHEMES:
        return word
    return _ALIASES.get(word) or next((s for s in SCHEMES if _is_typo(word, s)), None)


def _is_typo(word: str, scheme: str) -> bool:
    """One slip from ``scheme`` that keeps its first letter: a letter left out, doubled or
    two swapped (``pd``, ``piid``, ``pdi``, ``rya``); for ``slurm`` up to two slips of any
    kind (``slrum``, ``slurn``). A changed letter in a three-letter scheme is not a slip
    here: ``pig``, ``pit``, ``rat`` are words, and host names."""
    if not word or word == scheme or word[0] != scheme[0] or word.endswith("."):
        return False  # a trailing dot: a host name written so on purpose
    distance = _distance(word, scheme)
    if len(scheme) >= 5:
        return distance <= 2
    return distance == 1 and (len(word) != len(scheme) or sorted(word) == sorted(scheme))


def _distance(a: str, b: str) -> int:
    """Edit distance counting an adjacent transposition as one edit (optimal string alignment)."""
    rows = [list(range(len(b) + 1))] + [[i] + [0] * len(b) for i in range(1, len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = int(a[i - 1] != b[j - 1])
            rows[i][j] = min(rows[i - 1][j] + 1, rows[i][j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                rows[i][j] = min(rows[i][j], rows[i - 2][j - 2] + 1)
    return rows[len(a)][len(b)]


def _misspelt_scheme(text: str) -> str | None:
    """``pid:2282`` for ``pdi:2282``: a ``WORD:VALUE`` whose word is a slip of a scheme (or
    stands for one: ``srun:1234``) and whose value fits that scheme. Such a spec would
    otherwise parse as the endpoint of a host called ``pdi``, and be searched for in vain."""
    prefix, sep, value = text.partition(":")
    word = prefix.lower()
    if not sep or word in SCHEMES or ":" in value:
        return None
    scheme = _scheme_for(word)
    if scheme is None or (scheme == "ray" and not _RAY_ID.fullmatch(value)):
        return None
    candidate = f"{scheme}:{value}"
    try:
        _parse(candidate)
    except UsageError:
        return None
    return candidate
