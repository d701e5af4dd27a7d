"""Job spec parsing: every accepted form, and one-line UsageErrors for the rest."""

from __future__ import annotations

import pytest

from hangdoc.errors import UsageError
from hangdoc.jobspec import ACCEPTED_FORMS, JobKind, JobSpec, parse_job_spec

GOOD = [
    ("127.0.0.1:29500", JobSpec(JobKind.ENDPOINT, "127.0.0.1:29500", host="127.0.0.1", port=29500)),
    ("node-01.cluster.local:1234",
     JobSpec(JobKind.ENDPOINT, "node-01.cluster.local:1234", host="node-01.cluster.local",
             port=1234)),
    ("Node01:1", JobSpec(JobKind.ENDPOINT, "Node01:1", host="node01", port=1)),
    ("localhost:65535", JobSpec(JobKind.ENDPOINT, "localhost:65535", host="localhost",
                                port=65535)),
    ("[::1]:29500", JobSpec(JobKind.ENDPOINT, "[::1]:29500", host="::1", port=29500)),
    ("[fe80::1:2]:80", JobSpec(JobKind.ENDPOINT, "[fe80::1:2]:80", host="fe80::1:2", port=80)),
    ("  10.0.0.5:29500\n", JobSpec(JobKind.ENDPOINT, "10.0.0.5:29500", host="10.0.0.5",
                                   port=29500)),
    ("pid:4242", JobSpec(JobKind.PID, "pid:4242", pid=4242)),
    ("PID:7", JobSpec(JobKind.PID, "PID:7", pid=7)),
    ("slurm:123456", JobSpec(JobKind.SLURM, "slurm:123456", slurm_job="123456")),
    ("slurm:123456.0", JobSpec(JobKind.SLURM, "slurm:123456.0", slurm_job="123456",
                               slurm_step="0")),
    ("slurm:77_3.batch", JobSpec(JobKind.SLURM, "slurm:77_3.batch", slurm_job="77_3",
                                 slurm_step="batch")),
    ("ray:02000000", JobSpec(JobKind.RAY, "ray:02000000", ray_job="02000000")),
    ("ray:raysubmit_AbC123", JobSpec(JobKind.RAY, "ray:raysubmit_AbC123",
                                     ray_job="raysubmit_AbC123")),
]


@pytest.mark.parametrize(("text", "expected"), GOOD, ids=[g[0].strip() for g in GOOD])
def test_accepted_forms(text: str, expected: JobSpec) -> None:
    assert parse_job_spec(text) == expected


@pytest.mark.parametrize(("text", "canonical"), [
    ("LOCALHOST:29500", "localhost:29500"),
    ("[::1]:29500", "[::1]:29500"),
    ("pid:0042", "pid:42"),
    ("slurm:5.1", "slurm:5.1"),
    ("ray:abc", "ray:abc"),
])
def test_canonical_spelling(text: str, canonical: str) -> None:
    assert str(parse_job_spec(text)) == canonical


BAD = [
    ("", "empty"),
    ("   ", "empty"),
    ("29500", "not a known form"),
    ("host", "not a known form"),
    (":29500", "not a known form"),
    ("host:", "port ''"),
    ("host:0", "port '0'"),
    ("host:65536", "port '65536'"),
    ("host:29x", "port '29x'"),
    ("300.1.1.1:29500", "not an IPv4 address"),
    ("1.2.3:29500", "not an IPv4 address"),
    ("bad_host!:29500", "not a host name"),
    ("-bad.example:29500", "not a host name"),
    ("::1:29500", "write IPv6 addresses in brackets"),
    ("[::1]29500", "must be followed by :PORT"),
    ("[nothex]:29500", "not an IPv6 address"),
    ("pid:", "pid ''"),
    ("pid:abc", "pid 'abc'"),
    ("pid:0", "pid '0'"),
    ("pid:-3", "pid '-3'"),
    ("slurm:", "not a Slurm JOBID"),
    ("slurm:abc", "not a Slurm JOBID"),
    ("slurm:12.3.4", "not a Slurm JOBID"),
    ("ray:", "not a Ray job id"),
    ("ray:has space", "not a Ray job id"),
]


@pytest.mark.parametrize(("text", "reason"), BAD, ids=[b[0] or "<empty>" for b in BAD])
def test_malformed_specs_raise_one_line_usage_error(text: str, reason: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_job_spec(text)
    message = str(info.value)
    assert reason in message
    assert ACCEPTED_FORMS in message
    assert "\n" not in message
