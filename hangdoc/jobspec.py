"""Parse the JOB argument: ``HOST:PORT``, ``pid:PID``, ``slurm:JOBID[.STEP]``, ``ray:JOB_ID``.

The forms are those of DESIGN.md "Naming a job". Parsing is purely syntactic: whether a
host resolves or a pid exists is discovery's business (``hangdoc.discover``).
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass

from .errors import UsageError

ACCEPTED_FORMS = "HOST:PORT, [IPV6]:PORT, pid:PID, slurm:JOBID[.STEP] or ray:JOB_ID"

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")
_IPV4_LIKE = re.compile(r"^[0-9.]+$")
# Slurm job ids: 1234, array tasks 1234_7, heterogeneous components 1234+1.
_SLURM = re.compile(r"^(?P<job>\d+(?:_\d+|\+\d+)?)(?:\.(?P<step>\d+|batch|extern|interactive))?$")
# Ray job ids are hex ("02000000"), submission ids look like "raysubmit_AbC123".
_RAY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


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


def _malformed(text: str, reason: str) -> UsageError:
    return UsageError(f"bad job spec {text!r}: {reason}; expected {ACCEPTED_FORMS}")


def _parse_port(text: str, port: str) -> int:
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _malformed(text, f"port {port!r} is not a number from 1 to 65535")
    return int(port)


def _parse_endpoint(text: str) -> JobSpec:
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise _malformed(text, "a bracketed IPv6 address must be followed by :PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _malformed(text, f"{host!r} is not an IPv6 address") from None
        return JobSpec(JobKind.ENDPOINT, text, host=host, port=_parse_port(text, port))
    if text.count(":") > 1:
        raise _malformed(text, "write IPv6 addresses in brackets, like [::1]:29500")
    host, sep, port = text.partition(":")
    if not sep or not host:
        raise _malformed(text, "not a known form")
    if _IPV4_LIKE.match(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise _malformed(text, f"{host!r} is not an IPv4 address") from None
    elif not _HOSTNAME.match(host):
        raise _malformed(text, f"{host!r} is not a host name")
    return JobSpec(JobKind.ENDPOINT, text, host=host.rstrip(".").lower(),
                   port=_parse_port(text, port))


def _parse_pid(text: str, value: str) -> JobSpec:
    if not value.isdigit() or int(value) <= 0:
        raise _malformed(text, f"pid {value!r} is not a positive number")
    return JobSpec(JobKind.PID, text, pid=int(value))


def _parse_slurm(text: str, value: str) -> JobSpec:
    match = _SLURM.match(value)
    if not match:
        raise _malformed(text, f"{value!r} is not a Slurm JOBID or JOBID.STEP")
    return JobSpec(JobKind.SLURM, text, slurm_job=match["job"], slurm_step=match["step"])


def _parse_ray(text: str, value: str) -> JobSpec:
    if not _RAY.match(value):
        raise _malformed(text, f"{value!r} is not a Ray job id")
    return JobSpec(JobKind.RAY, text, ray_job=value)


def parse_job_spec(text: str) -> JobSpec:
    """Parse JOB; raise ``UsageError`` (one line naming the accepted forms) when malformed."""
    stripped = text.strip()
    if not stripped:
        raise _malformed(text, "empty")
    prefix, sep, value = stripped.partition(":")
    prefix = prefix.lower()
    if sep and prefix == "pid":
        return _parse_pid(stripped, value)
    if sep and prefix == "slurm":
        return _parse_slurm(stripped, value)
    if sep and prefix == "ray":
        return _parse_ray(stripped, value)
    return _parse_endpoint(stripped)
