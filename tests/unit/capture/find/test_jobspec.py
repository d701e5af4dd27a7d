"""Job spec parsing: every accepted form, and one-line UsageErrors for the rest."""

from __future__ import annotations

import pytest

from hangdoc.capture.find.jobspec import (
    ACCEPTED_FORMS,
    PID_MAX,
    PORT_MAX,
    JobKind,
    JobSpec,
    parse_job_spec,
)
from hangdoc.errors import UsageError

GOOD = [
    ("127.0.0.1:29500", JobSpec(JobKind.ENDPOINT, "127.0.0.1:29500", host="127.0.0.1", port=29500)),
    (
        "node-01.cluster.local:1234",
        JobSpec(JobKind.ENDPOINT, "node-01.cluster.local:1234", host="node-01.cluster.local", port=1234),
    ),
    ("Node01:1", JobSpec(JobKind.ENDPOINT, "Node01:1", host="node01", port=1)),
    ("localhost:65535", JobSpec(JobKind.ENDPOINT, "localhost:65535", host="localhost", port=65535)),
    ("[::1]:29500", JobSpec(JobKind.ENDPOINT, "[::1]:29500", host="::1", port=29500)),
    ("[fe80::1:2]:80", JobSpec(JobKind.ENDPOINT, "[fe80::1:2]:80", host="fe80::1:2", port=80)),
    ("  10.0.0.5:29500\n", JobSpec(JobKind.ENDPOINT, "10.0.0.5:29500", host="10.0.0.5", port=29500)),
    ("pid:4242", JobSpec(JobKind.PID, "pid:4242", pid=4242)),
    ("PID:7", JobSpec(JobKind.PID, "PID:7", pid=7)),
    ("slurm:123456", JobSpec(JobKind.SLURM, "slurm:123456", slurm_job="123456")),
    ("slurm:123456.0", JobSpec(JobKind.SLURM, "slurm:123456.0", slurm_job="123456", slurm_step="0")),
    ("slurm:77_3.batch", JobSpec(JobKind.SLURM, "slurm:77_3.batch", slurm_job="77_3", slurm_step="batch")),
    ("ray:02000000", JobSpec(JobKind.RAY, "ray:02000000", ray_job="02000000")),
    ("ray:raysubmit_AbC123", JobSpec(JobKind.RAY, "ray:raysubmit_AbC123", ray_job="raysubmit_AbC123")),
]


@pytest.mark.parametrize(("text", "expected"), GOOD, ids=[g[0].strip() for g in GOOD])
def test_accepted_forms(text: str, expected: JobSpec) -> None:
    assert parse_job_spec(text) == expected


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("LOCALHOST:29500", "localhost:29500"),
        ("[::1]:29500", "[::1]:29500"),
        ("pid:0042", "pid:42"),
        ("slurm:5.1", "slurm:5.1"),
        ("ray:abc", "ray:abc"),
    ],
)
def test_canonical_spelling(text: str, canonical: str) -> None:
    assert str(parse_job_spec(text)) == canonical


BAD = [
    ("", "empty"),
    ("   ", "empty"),
    ("29500", "a bare number; did you mean pid:29500?"),
    ("host", "a host without its port; did you mean host:29500?"),
    (":29500", "a port without its host; did you mean 127.0.0.1:29500?"),
    ("!!!", "not a known form"),
    ("host:", "port ''"),
    ("host:0", "port '0'"),
    ("host:65536", "port '65536'"),
    ("host:29x", "port '29x'"),
    ("300.1.1.1:29500", "not an IPv4 address"),
    ("1.2.3:29500", "not an IPv4 address"),
    ("bad_host!:29500", "not a host name"),
    ("-bad.example:29500", "not a host name"),
    ("::1:29500", "write IPv6 addresses in brackets, like [::1]:29500; did you mean [::1]:29500?"),
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
    # ASCII digits only: str.isdigit() and int() take these, and int("²") then raises
    ("pid:²", "pid '²' is not a number from 1 to 4194304"),
    ("pid:٣", "pid '٣'"),
    ("pid:１２", "pid '１２'"),
    ("pid:1_000", "pid '1_000'"),
    ("pid:+5", "pid '+5'"),
    ("pid:4194305", "pid '4194305' is not a number from 1 to 4194304"),
    ("pid:" + "9" * 5000, "longer than 1024 characters"),
    ("HOST:²", "port '²' is not a number from 1 to 65535"),
    ("host:٣٣", "port '٣٣'"),
    ("HOST:99999", "port '99999'"),
    ("[::1]:²", "port '²'"),
    ("[::١]:80", "is not an IPv6 address"),
    ("١.١.١.١:80", "not a host name"),
    ("slurm:١٢", "not a Slurm JOBID"),
    ("slurm:1\n2", "control characters"),
    ("host\n:80", "control characters"),
    ("a\x1b[2J:1", "control characters"),
    ("x" * 2**20, "longer than 1024 characters"),
]


@pytest.mark.parametrize(("text", "reason"), BAD, ids=[b[0][:30] or "<empty>" for b in BAD])
def test_malformed_specs_raise_one_line_usage_error(text: str, reason: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_job_spec(text)
    message = str(info.value)
    assert reason in message
    assert ACCEPTED_FORMS in message
    assert "\n" not in message


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "suggestion", "help_part"),
    [
        # a slip of a scheme, whose value fits it: not a host called pdi
        ("pdi:2282", "pid:2282", "Write it with a trailing dot: pdi.:2282"),
        ("PDI:2282", "pid:2282", "PDI.:2282"),
        ("pd:2282", "pid:2282", None),
        ("piid:2282", "pid:2282", None),
        ("ppid:2282", "pid:2282", None),
        ("slrum:1234.0", "slurm:1234.0", None),
        ("slurn:1234", "slurm:1234", None),
        ("srun:1234.0", "slurm:1234.0", None),
        ("rya:raysubmit_AbC123", "ray:raysubmit_AbC123", None),
        # a bare value, or a scheme and its value glued with something other than ':'
        ("2282", "pid:2282", "If 2282 is the ranks' MASTER_PORT, name their host too: HOST:2282"),
        ("pid 2282", "pid:2282", None),
        ("pid=2282", "pid:2282", None),
        ("pid2282", "pid:2282", None),
        ("process 2282", "pid:2282", None),
        ("pid: 2282", "pid:2282", None),
        ("pid:'2282'", "pid:2282", None),
        ("pid:#2282", "pid:2282", None),
        ("1234.0", "slurm:1234.0", None),
        ("1234_7", "slurm:1234_7", None),
        ("slurm 1234.batch", "slurm:1234.batch", None),
        ("raysubmit_AbC123", "ray:raysubmit_AbC123", None),
        ("02000000", "ray:02000000", None),  # Ray's hex job id: no pid starts with 0
        # endpoints
        ("tcp://10.0.0.1:29500", "10.0.0.1:29500", None),
        ("env://node1:29500/", "node1:29500", None),
        ("::1:29500", "[::1]:29500", None),
        ("node01", "node01:29500", "29500 is torchrun's default"),
        (":29500", "127.0.0.1:29500", "MASTER_ADDR"),
    ],
)
def test_errors_suggest_the_closest_valid_spec(text: str, suggestion: str, help_part: str | None) -> None:
    with pytest.raises(UsageError) as info:
        parse_job_spec(text)
    message = str(info.value)
    assert f"; did you mean {suggestion}? Expected {ACCEPTED_FORMS}" in message
    assert "\n" not in message
    parse_job_spec(suggestion)  # the suggestion itself is valid
    if help_part is not None:
        assert help_part in info.value.help


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text",
    [
        # real host names stay hosts: a changed letter in a 3-letter scheme is a word, not a slip
        "pit:8080",
        "pig:80",
        "rat:29500",
        "bay:1",
        "node-pid:29500",
        "ipd:4",
        # a slip of ray: whose value is no Ray job id (hex, or raysubmit_...) is a host too
        "rya:29500",
        # the way to name a host called like a scheme or a slip of one: a trailing dot
        "pdi.:2282",
        "pid.:2282",
        "slurm.:6817",
    ],
)
def test_host_names_near_a_scheme_still_parse_as_endpoints(text: str) -> None:
    spec = parse_job_spec(text)
    assert spec.kind is JobKind.ENDPOINT
    again = parse_job_spec(str(spec))  # the canonical spelling reads back as the same endpoint
    assert (again.kind, again.host, again.port) == (spec.kind, spec.host, spec.port)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ["pid:abc", "slurm:abc", "ray:has space", "host:", "x:y:z:w"])
def test_no_suggestion_where_nothing_is_near(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_job_spec(text)
    assert "did you mean" not in str(info.value)


def test_pid_and_port_bounds_are_inclusive() -> None:
    assert parse_job_spec(f"pid:{PID_MAX}").pid == PID_MAX == 2**22
    assert parse_job_spec("pid:1").pid == 1
    assert parse_job_spec(f"h:{PORT_MAX}").port == 65535
    assert parse_job_spec("h:1").port == 1


def test_long_spec_is_shown_cut_and_escaped() -> None:
    with pytest.raises(UsageError) as info:
        parse_job_spec("\x1b[2J" + "x" * 2**20)
    message = str(info.value)
    assert len(message) < 400 and "\x1b" not in message and "(1048580 characters)" in message


@pytest.mark.parametrize(
    ("text", "job_id"),
    [
        ("ray:raysubmit_Ab12", "raysubmit_Ab12"),
        ("ray:02000000", "02000000"),
        ("slurm:1234.0", "1234.0"),
        ("slurm:1234_7", "1234_7"),
        ("pid:42", "pid:42"),
        ("node1:29500", "node1:29500"),
    ],
)
def test_job_id_is_what_the_scheduler_calls_the_job(text: str, job_id: str) -> None:
    assert parse_job_spec(text).job_id == job_id
