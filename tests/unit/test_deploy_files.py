"""The deployment files (``agents/``, ``Dockerfile``) stay in step with the code: they parse
as what they claim to be, name only the metrics ``hangdoc server`` exports (with labels and
label values it uses), pass only flags ``hangdoc server`` and ``hangdoc agent`` accept, and
agree with each other (the Secret, the Service the agents report to, the labels the
NetworkPolicies select)."""

from __future__ import annotations

import argparse
import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO

from hangdoc.cli import build_parser
from hangdoc.errors import UsageError

AGENTS = REPO / "agents"
DASHBOARD = AGENTS / "grafana" / "hangdoc-server.json"
RULES = AGENTS / "prometheus" / "hangdoc-server-rules.yaml"
SERVER_YAML = AGENTS / "kubernetes" / "server.yaml"
DAEMONSET = AGENTS / "kubernetes" / "daemonset.yaml"
SERVER_UNIT = AGENTS / "systemd" / "hangdoc-server.service"
SERVER_ENV = AGENTS / "systemd" / "hangdoc-server.env"
AGENT_UNIT = AGENTS / "systemd" / "hangdoc-agent.service"
AGENT_ENV = AGENTS / "systemd" / "hangdoc-agent.env"
DOCKERFILE = REPO / "Dockerfile"

# What `hangdoc server` exports on /metrics: each metric's labels, and the values a label
# may take where the contract fixes them. A histogram also has _bucket/_sum/_count series.
METRICS: dict[str, set[str]] = {
    "hangdoc_server_incidents_total": {"verdict"},
    "hangdoc_server_open_incidents": set(),
    "hangdoc_server_jobs": {"state"},
    "hangdoc_server_agents": {"state"},
    "hangdoc_server_diagnoses_total": {"outcome"},
    "hangdoc_server_diagnosis_seconds": set(),
    "hangdoc_server_notifications_total": {"outcome"},
    "hangdoc_server_agent_reports_total": set(),
    "hangdoc_server_info": {"version"},
}
HISTOGRAMS = {"hangdoc_server_diagnosis_seconds"}
LABEL_VALUES: dict[tuple[str, str], set[str]] = {
    ("hangdoc_server_jobs", "state"): {"running", "suspected", "hung", "dismissed"},
    ("hangdoc_server_agents", "state"): {"live", "stale"},
    ("hangdoc_server_diagnoses_total", "outcome"): {"incident", "not_hung", "failed"},
    ("hangdoc_server_notifications_total", "outcome"): {"sent", "failed"},
}
# labels Prometheus adds to every series it scrapes
TARGET_LABELS = {"instance", "job"}

ALERTS = {
    "HangdocOpenIncident",
    "HangdocServerDown",
    "HangdocAgentsStale",
    "HangdocDiagnosisFailing",
    "HangdocNotificationsFailing",
}

# values for the $(VAR) references of the Kubernetes manifests, as the kubelet fills them in
POD_ENV = {"POD_IP": "10.0.0.11", "NODE_NAME": "gpu-node-1"}


# ---------------------------------------------------------------------------------------------
# the CLI


@functools.cache
def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


needs_server = pytest.mark.skipif("server" not in _subcommands(), reason="`hangdoc server` is not a subcommand yet")


def _check_argv(argv: list[str], where: str) -> None:
    """``argv`` (after ``hangdoc``) names only options its subcommand has, and parses."""
    command, *args = argv
    assert command in _subcommands(), f"{where}: no subcommand {command!r}"
    options = {s for action in _subcommands()[command]._actions for s in action.option_strings}
    flags = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    assert flags <= options, f"{where}: `hangdoc {command}` has no {sorted(flags - options)}"
    try:
        build_parser().parse_args(argv)
    except UsageError as err:
        pytest.fail(f"{where}: `hangdoc {shlex.join(argv)}` does not parse: {err}")


# ---------------------------------------------------------------------------------------------
# PromQL: the metrics, labels and label values an expression names

_NAME = re.compile(r"\bhangdoc_[a-z0-9_]+")
_SELECTOR = re.compile(r"\b(hangdoc_[a-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _metric(series: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        base = series.removesuffix(suffix)
        if base != series and base in HISTOGRAMS:
            return base
    return series


def _check_expr(expr: str, where: str) -> set[str]:
    """The server metrics ``expr`` reads; fails on a name, label or value the server lacks."""
    names = {_metric(name) for name in _NAME.findall(expr)}
    assert names <= METRICS.keys(), f"{where}: unknown metrics {sorted(names - METRICS.keys())} in {expr!r}"
    for series, matchers in _SELECTOR.findall(expr):
        metric = _metric(series)
        for label, op, value in _MATCHER.findall(matchers):
            if label in TARGET_LABELS or (label == "le" and metric in HISTOGRAMS):
                continue
            assert label in METRICS[metric], f"{where}: {metric} has no label {label!r}"
            allowed = LABEL_VALUES.get((metric, label))
            if allowed is not None and op in ("=", "!="):
                assert value in allowed, f"{where}: {metric}{{{label}}} is never {value!r}"
    labels = set().union(*(METRICS[name] for name in names)) | TARGET_LABELS
    if names & HISTOGRAMS:
        labels.add("le")
    for group in _GROUPING.findall(expr):
        used = {label.strip() for label in group.split(",") if label.strip()}
        assert used <= labels, f"{where}: grouping by {sorted(used - labels)}, which no metric carries"
    return names


def test_metrics_list_is_what_the_server_exports() -> None:
    """``METRICS`` and ``LABEL_VALUES`` against the exporter itself (a scrape with nothing
    watched: every labelled series is there from the start)."""
    metrics = pytest.importorskip("hangdoc.service.metrics", reason="`hangdoc server` is not written yet")

    class Store:
        def open_incidents(self) -> list[object]:
            return []

    class View:
        store = Store()

        def jobs(self) -> list[object]:
            return []

        def agents(self) -> list[object]:
            return []

    text = metrics.ServiceMetrics(stale_after=90.0).render(View()).decode()
    exported: dict[str, set[tuple[str, str]]] = {}
    for series, labels in re.findall(r"^(hangdoc_\w+?)(?:\{(.*)\})? \S+$", text, re.MULTILINE):
        if series.endswith("_created"):
            continue
        pairs = set(_MATCHER.findall(labels))
        exported.setdefault(_metric(series), set()).update((label, value) for label, _, value in pairs if label != "le")
    assert exported.keys() == METRICS.keys()
    for name, pairs in exported.items():
        assert {label for label, _ in pairs} == METRICS[name], name
    for (name, label), values in LABEL_VALUES.items():
        assert {v for lbl, v in exported[name] if lbl == label} == values, (name, label)


def test_check_expr_catches_mistakes() -> None:
    assert _check_expr('sum by (le) (rate(hangdoc_server_diagnosis_seconds_bucket{job="x"}[5m]))', "t") == {
        "hangdoc_server_diagnosis_seconds"
    }
    for bad in (
        "hangdoc_server_incidents",  # the counter is _total
        'hangdoc_server_jobs{state="stuck"}',
        'hangdoc_server_agents{verdict="x"}',
        "sum by (outcome) (hangdoc_server_jobs)",
    ):
        with pytest.raises(AssertionError):
            _check_expr(bad, "t")


# ---------------------------------------------------------------------------------------------
# Grafana


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def test_dashboard_reads_only_server_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] == 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = [p for p in _panels(dashboard["panels"]) if p["type"] != "row"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    seen: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = _check_expr(target["expr"], f"panel {panel['title']!r}")
            assert names, f"panel {panel['title']!r} reads no hangdoc metric: {target['expr']!r}"
            seen |= names
    assert seen == METRICS.keys(), f"metrics on no panel: {sorted(METRICS.keys() - seen)}"
    kinds = {p["type"] for p in panels}
    assert {"stat", "timeseries"} <= kinds
    assert any("histogram_quantile(0.95" in t["expr"] for p in panels for t in p["targets"])


# ---------------------------------------------------------------------------------------------
# Prometheus


def test_alerting_rules() -> None:
    yaml = pytest.importorskip("yaml")
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    by_name = {rule["alert"]: rule for rule in rules}
    assert by_name.keys() == ALERTS
    for name, rule in by_name.items():
        assert {"summary", "description"} <= rule["annotations"].keys(), name
        assert rule["labels"]["severity"] in ("page", "warning", "info"), name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        names = _check_expr(rule["expr"], name)
        assert names or "up{" in rule["expr"], f"{name} reads no hangdoc metric"
    assert by_name["HangdocOpenIncident"]["labels"]["severity"] == "page"
    assert "hangdoc_server_open_incidents" in by_name["HangdocOpenIncident"]["expr"]
    assert by_name["HangdocOpenIncident"]["for"] == "5m"
    assert by_name["HangdocServerDown"]["for"] == "5m"
    assert by_name["HangdocAgentsStale"]["for"] == "10m"
    assert 'state="stale"' in by_name["HangdocAgentsStale"]["expr"]
    assert 'outcome="failed"' in by_name["HangdocDiagnosisFailing"]["expr"]
    assert 'outcome="failed"' in by_name["HangdocNotificationsFailing"]["expr"]


# ---------------------------------------------------------------------------------------------
# Kubernetes


def _documents(path: Path) -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml")
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def _container_argv(workload: dict[str, Any]) -> list[str]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return [re.sub(r"\$\((\w+)\)", lambda m: POD_ENV[m.group(1)], arg) for arg in container["args"]]


def _flag(argv: list[str], name: str) -> str:
    """The value of option ``name``, given once as ``NAME=VALUE`` or ``NAME VALUE``."""
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"{name}=")]
    values += [value for arg, value in zip(argv, argv[1:], strict=False) if arg == name]
    assert len(values) == 1, f"{name} given {len(values)} times in {argv}"
    return values[0]


def test_server_manifest() -> None:
    docs = _documents(SERVER_YAML)
    assert {"Deployment", "Service", "PersistentVolumeClaim"} <= {doc["kind"] for doc in docs}
    deployment, service, claim = (_one(docs, kind) for kind in ("Deployment", "Service", "PersistentVolumeClaim"))
    agents = _documents(DAEMONSET)
    namespace = _one(agents, "DaemonSet")["metadata"]["namespace"]
    assert {doc["metadata"]["namespace"] for doc in docs} == {namespace}

    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    # SQLite on a ReadWriteOnce volume: one writer, the old pod gone before the new one
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = [v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v]
    assert claims == [claim["metadata"]["name"]]

    # unprivileged
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert not pod.get("hostPID")
    assert {"requests", "limits"} <= container["resources"].keys()
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz", probe

    # the database on the volume, the token from the agents' Secret
    argv = _container_argv(deployment)
    assert argv[0] == "server"
    mounted = {Path(m["mountPath"]): volumes[m["name"]] for m in container["volumeMounts"]}
    assert "persistentVolumeClaim" in mounted[Path(_flag(argv, "--db")).parent]
    token = mounted[Path(_flag(argv, "--token-file")).parent]
    agent_pod = _one(agents, "DaemonSet")["spec"]["template"]["spec"]
    agent_secret = next(v["secret"]["secretName"] for v in agent_pod["volumes"] if "secret" in v)
    assert token["secret"]["secretName"] == agent_secret

    # the Service selects the pods, on the port the server listens on
    port = int(_flag(argv, "--listen").rsplit(":", 1)[1])
    assert container["ports"][0]["containerPort"] == port
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["port"] for p in service["spec"]["ports"]] == [7430]

    # the agents report to that Service, and their NetworkPolicy lets them (and lets the
    # server call them back)
    agent_argv = _container_argv(_one(agents, "DaemonSet"))
    assert _flag(agent_argv, "--server") == f"{service['metadata']['name']}.{namespace}.svc:7430"
    policy = _one(agents, "NetworkPolicy")["spec"]
    assert "Egress" in policy["policyTypes"]
    assert any(
        any(peer.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items() for peer in rule["to"])
        and {"protocol": "TCP", "port": 7430} in rule["ports"]
        for rule in policy["egress"]
    ), "the agents' NetworkPolicy denies their reports to the server"
    assert any(
        peer.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
        for rule in policy["ingress"]
        for peer in rule["from"]
    ), "the agents' NetworkPolicy keeps the server out"


def test_daemonset_agent_args() -> None:
    _check_argv(_container_argv(_one(_documents(DAEMONSET), "DaemonSet")), "daemonset.yaml")


@needs_server
def test_server_manifest_args() -> None:
    _check_argv(_container_argv(_one(_documents(SERVER_YAML), "Deployment")), "server.yaml")


# ---------------------------------------------------------------------------------------------
# systemd


def _unit(path: Path) -> dict[str, list[str]]:
    """Each key's values, in order (a key may repeat)."""
    values: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def _env_lines(path: Path) -> list[tuple[str, str]]:
    """``NAME=value`` lines of an environment file, commented examples included."""
    # a commented example may go on in prose after ", "
    return re.findall(r"^#? ?(HANGDOC_[A-Z_]+)=(.*?)(?:,\s.*)?$", path.read_text(), re.MULTILINE)


def _exec_argvs(unit: Path, env_file: Path) -> list[list[str]]:
    """ExecStart, as systemd expands it, with the unit's defaults and with each setting (or
    commented example) of the environment file in turn."""
    values = _unit(unit)
    (exec_start,) = values["ExecStart"]
    defaults = dict(value.split("=", 1) for value in values["Environment"] if value.startswith("HANGDOC_"))
    credentials = f"/run/credentials/{unit.name}"

    def expand(env: dict[str, str]) -> list[str]:
        argv: list[str] = []
        for word in shlex.split(exec_start.replace("%d", credentials))[1:]:
            if re.fullmatch(r"\$\w+", word):  # $VAR: split on white space
                argv.extend(env[word[1:]].split())
            else:
                argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word))
        return argv

    argvs = [expand(defaults)]
    for name, value in _env_lines(env_file):
        assert name in defaults, f"{env_file.name}: {name} is not one of the unit's variables"
        argvs.append(expand({**defaults, name: value}))
    return argvs


def test_agent_unit_args() -> None:
    for argv in _exec_argvs(AGENT_UNIT, AGENT_ENV):
        _check_argv(argv, AGENT_UNIT.name)


@needs_server
def test_server_unit_args() -> None:
    for argv in _exec_argvs(SERVER_UNIT, SERVER_ENV):
        _check_argv(argv, SERVER_UNIT.name)


def test_server_unit() -> None:
    values = _unit(SERVER_UNIT)
    argv = _exec_argvs(SERVER_UNIT, SERVER_ENV)[0]
    assert argv[0] == "server"
    # unprivileged, its SQLite file in its own state directory, the token as a credential
    assert values.get("DynamicUser") == ["yes"] or values.get("User", ["root"]) != ["root"]
    assert values["CapabilityBoundingSet"] == [""]
    (state,) = values["StateDirectory"]
    assert Path(_flag(argv, "--db")).parent == Path("/var/lib") / state
    credentials = dict(value.split(":", 1) for value in values["LoadCredential"])
    assert _flag(argv, "--token-file") == f"/run/credentials/{SERVER_UNIT.name}/token"
    assert credentials["token"] == "/etc/hangdoc/token"
    for key, wanted in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("Restart", "on-failure"),
    ):
        assert values[key] == [wanted], key
    assert "TimeoutStopSec" in values
    # secrets never in the world-readable file
    assert not {name for name, _ in _env_lines(SERVER_ENV)} & {"HANGDOC_NOTIFY_WEBHOOK", "PGPASSWORD"}


# ---------------------------------------------------------------------------------------------
# Dockerfile


def _instruction(name: str) -> str:
    (value,) = re.findall(rf"^{name}\s+(.*)$", DOCKERFILE.read_text(), re.MULTILINE)
    return value


def test_dockerfile() -> None:
    assert _instruction("FROM") == "python:3.11-slim"
    assert json.loads(_instruction("ENTRYPOINT")) == ["hangdoc"]
    cmd = json.loads(_instruction("CMD"))
    assert cmd[0] == "server"
    assert _instruction("USER") not in ("root", "0")
    assert _instruction("EXPOSE") == _flag(cmd, "--listen").rsplit(":", 1)[1]
    assert "[postgres]" in _instruction("RUN")
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


@needs_server
def test_dockerfile_cmd_args() -> None:
    _check_argv(json.loads(_instruction("CMD")), "Dockerfile")
