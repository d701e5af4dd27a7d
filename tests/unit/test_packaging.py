"""The distributions: what `python -m build` makes of the checkout, and the dependency
ranges that the generated gRPC code sets.

The sdist and the wheel (built from the sdist, as pip builds a downloaded sdist) are built
once, from a copy of the files that make them, with the build backend of this environment
(``--no-isolation``: no download). Skipped only where the ``build`` package is missing
(it is in the ``test-fast`` extra).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from support.paths import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PTH = "hangdoc-probe.pth"
PROTO = "proto/hangdoc/v1/agent.proto"
GENERATED = REPO / "hangdoc" / "fleet" / "v1"
# what the sdist is made of besides the package
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md", PROTO)


class Built:
    def __init__(self, out: Path, log: str) -> None:
        self.log = log
        (self.sdist,) = out.glob("hangdoc-*.tar.gz")
        (self.wheel,) = out.glob("hangdoc-*.whl")
        with zipfile.ZipFile(self.wheel) as whl:
            self.wheel_files = {name: whl.read(name) for name in whl.namelist()}
        with tarfile.open(self.sdist) as sdist:
            self.sdist_names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
        info = next(n for n in self.wheel_files if n.endswith(".dist-info/METADATA"))
        self.metadata = Parser().parsestr(self.wheel_files[info].decode())


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    pytest.importorskip("build", reason="the build package is not installed (pip install build)")
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "hangdoc", src / "hangdoc", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    # byte-compiling off (PYTHONDONTWRITEBYTECODE) makes setuptools say so: not the project's
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    return Built(out, log)


def test_the_build_prints_no_warning(built) -> None:
    # setuptools' deprecations ("project.license as a TOML table is deprecated") and its
    # "warning: no files found matching" for MANIFEST.in lines would show here
    assert [line for line in built.log.splitlines() if re.search(r"warn|deprecat", line, re.IGNORECASE)] == []


def test_the_wheel_holds_the_license_types_proto_schema_and_start_up_hook(built) -> None:
    files = built.wheel_files
    (license_file,) = [n for n in files if n.endswith(".dist-info/licenses/LICENSE")]
    assert files[license_file] == (REPO / "LICENSE").read_bytes()
    assert "hangdoc/py.typed" in files
    assert "hangdoc/fleet/v1/agent_pb2.pyi" in files
    assert files["hangdoc/fleet/v1/agent.proto"] == (REPO / PROTO).read_bytes()
    schema = "hangdoc/report/report.schema.json"  # hangdoc.report_schema() reads it
    assert files[schema] == (REPO / schema).read_bytes()
    hook = (REPO / "hangdoc" / "probe_hook" / PTH).read_bytes()
    assert files[PTH] == files[f"hangdoc/probe_hook/{PTH}"] == hook  # the root copy is the one Python runs
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    recorded = {line.split(",")[0] for line in files[record].decode().splitlines()}
    assert {PTH, "hangdoc/fleet/v1/agent.proto", "hangdoc/py.typed"} <= recorded


def test_the_wheel_holds_the_package_and_nothing_else(built) -> None:
    tops = {name.split("/")[0] for name in built.wheel_files}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hangdoc", PTH}
    assert not [n for n in built.wheel_files if "tests/" in n or n.startswith("tests")]
    assert not [n for n in built.wheel_files if n.endswith(".pyc")]


def test_the_sdist_builds_the_wheel_alone(built) -> None:
    names = built.sdist_names
    assert set(SOURCES) <= names  # the wheel was built from it: it held what the build needs
    assert "PKG-INFO" in names
    assert not [n for n in names if n.startswith("tests/")]


def test_the_metadata(built) -> None:
    meta = built.metadata
    assert meta["License-Expression"] == PYPROJECT["project"]["license"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert not [c for c in meta.get_all("Classifier") if c.startswith("License ::")]  # SPDX only
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert meta["Description-Content-Type"] == "text/markdown"
    requires = meta.get_all("Requires-Dist")
    for name in ("grpcio", "protobuf", "grpcio-health-checking"):
        assert not [r for r in requires if r.startswith(f"{name}==")], requires  # ranges, not pins


# ------------------------------------------------------------------ the ranges


def _floors() -> dict[str, str]:
    """The lower bound pyproject.toml gives each of the gRPC packages."""
    floors = {}
    for req in PYPROJECT["project"]["dependencies"]:
        m = re.fullmatch(r"(grpcio|protobuf|grpcio-health-checking)>=([0-9.]+)(,<[0-9.]+)?", req)
        if m:
            floors[m[1]] = m[2]
    return floors


def test_the_floors_are_what_the_generated_code_checks() -> None:
    """`make proto` writes version checks into the code: grpcio and protobuf may not be
    older than those (it raises on import), and protobuf must keep its major version."""
    floors = _floors()
    grpc_code = (GENERATED / "agent_pb2_grpc.py").read_text()
    (generated_grpc,) = re.findall(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", grpc_code, re.MULTILINE)
    assert floors["grpcio"] == generated_grpc
    call = re.search(r"ValidateProtobufRuntimeVersion\((.*?)\)", (GENERATED / "agent_pb2.py").read_text(), re.DOTALL)
    assert call is not None
    major, minor, patch = (ast.literal_eval(a.strip()) for a in call[1].split(",")[1:4])
    assert floors["protobuf"] == f"{major}.{minor}.{patch}"
    assert f"protobuf>={major}.{minor}.{patch},<{major + 1}" in PYPROJECT["project"]["dependencies"]
    assert set(floors) == {"grpcio", "protobuf", "grpcio-health-checking"}


def test_ci_tests_at_the_floors() -> None:
    """.ci/lowest.txt pins what pyproject.toml accepts at the least: CI runs the fast tests there."""
    pins = dict(
        line.split("==")
        for line in (REPO / ".ci" / "lowest.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pins == _floors()
