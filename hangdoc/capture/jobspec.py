"""Parse the JOB argument: ``HOST:PORT``, ``pid:PID``, ``slurm:JOBID[.STEP]``, ``ray:JOB_ID``.

The forms are those of docs/user-guide.md, "Naming the job". Parsing is purely syntactic: whether a
host resolves or a pid exists is discovery's business (``hangdoc.discover``).
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass

from ..errors import UsageError, shown
from ..model import PID_MAX, PID_MIN, bounded_int

ACCEPTED_FORMS = "HOST:PORT, [IPV6]:PORT, pid:PID, slurm:JOBID[.STEP] or ray:JOB_ID"

PORT_MIN, PORT_MAX = 1, 65535  # a job's MASTER_PORT
SPEC_MAX_CHARS = 1024  # a host name is at most 253 characters; anything longer is not a spec


# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
_IPV4_LIKE = re.compile(r"[0-9.]+")
# Slurm job ids: 1234, array tasks 1234_7, heterogeneous components 1234+1.
_SLURM = re.compile(r"(?P<job>\d+(?:_\d+|\+\d+)?)(?:\.(?P<step>\d+|batch|extern|interactive))?",
                    re.ASCII)
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
    return JobSpec(JobKind.ENDPOINT, text, host=host.rstrip(".").lower(),
                   port=_parse_port(text, port))


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
    """Parse JOB; raise ``UsageError`` (one line naming the accepted forms) when malformed."""
    if len(text) > SPEC_MAX_CHARS:
        raise _malformed(text, f"longer than {SPEC_MAX_CHARS} characters")
    stripped = text.strip()
    if not stripped:
        raise _malformed(text, "empty")
    if not stripped.isprintable():
        raise _malformed(text, "it contains control characters or bytes that are not text")
    prefix, sep, value = stripped.partition(":")
    prefix = prefix.lower()
    if sep and prefix == "pid":
        return _parse_pid(stripped, value)
    if sep and prefix == "slurm":
        return _parse_slurm(stripped, value)
    if sep and prefix == "ray":
        return _parse_ray(stripped, value)
    return _parse_endpoint(stripped)
