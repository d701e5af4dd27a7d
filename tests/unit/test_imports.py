"""The house rules: imports run one way, down the pipeline, and nothing imports in a circle.

Read from the source with ``ast`` (every import counts: module level, inside functions,
under ``TYPE_CHECKING``), so a rule is broken the moment the line is written, not when a
code path happens to run. ``docs/architecture.md`` explains the rules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx
import pytest
from support.paths import REPO

PACKAGE = REPO / "hangdoc"
# the snapshot file format's files (hangdoc/bundle/), lowest first: each imports only those
# before it, and none the package itself (its __init__ re-exports them)
BUNDLE = [
    "files",
    "limits",
    "invalid",
    "stacks",
    "layout",
    "columns",
    "tables",
    "codec",
    "adders",
    "writer",
    "first",
    "reader",
]
# the ground floor's own homes for what every floor uses: each imports only the standard
# library (no hangdoc module, no third-party package)
HOMES = {
    "hangdoc.model",
    "hangdoc.rankranges",
    "hangdoc.memo",
    "hangdoc.digits",
    "hangdoc.addresses",
    "hangdoc.filekinds",
    "hangdoc.safefiles",
}
GROUND = {
    "hangdoc",
    "hangdoc.errors",
    "hangdoc.bundle",
    "hangdoc.outfiles",
    "hangdoc.waitwords",
    "hangdoc.heartbeat",
    "hangdoc.probe",
    "hangdoc.probe_hook",
    "hangdoc.probe_hook.sitecustomize",
    *HOMES,
    *(f"hangdoc.bundle.{name}" for name in BUNDLE),
}

# what each floor may import besides the standard library, third-party packages and itself
MAY_IMPORT = {
    "ground": {"ground"},
    "capture": {"ground"},
    "analysis": {"ground"},
    "report": {"ground"},
    "fleet": {"ground", "capture"},
    "pipeline": {"ground", "capture", "fleet", "analysis"},
    "watch": {"ground", "capture", "fleet", "analysis", "report", "pipeline"},
    "ray": {"ground", "capture", "fleet", "analysis", "pipeline"},  # hangdoc.ray: ray:JOB
    # hangdoc server: the standing coordinator, its store, its HTTP side (hangdoc.service)
    "service": {"ground", "capture", "fleet", "analysis", "report", "pipeline"},
    # hangdoc.diagnose()/analyze(): the commands' path as functions (the watchdog and the
    # service are commands of their own)
    "api": {"ground", "capture", "fleet", "analysis", "report", "pipeline", "ray"},
    "cli": {"ground", "capture", "fleet", "analysis", "report", "pipeline", "watch", "ray", "service"},
}
# modules of a floor above that a floor may import besides its MAY_IMPORT: the API checks
# its options against the ranges of the CLI's options
MAY_ALSO_IMPORT = {"api": {"hangdoc.cliargs"}}
# the package root names the API (PEP 562 ``__getattr__``, and for type checkers under
# ``TYPE_CHECKING``) but never imports it as it is imported itself: ``import hangdoc`` in a
# training script stays free of every dependency
LAZY = {"hangdoc": {"hangdoc.api"}}
# third-party modules only one floor may use
ONLY_IN = {
    "networkx": {"analysis"},
    "grpc": {"fleet"},
    "google.protobuf": {"fleet"},
    "ray": {"capture", "fleet", "ray"},
    "prometheus_client": {"watch", "service"},
    "sqlalchemy": {"service"},
    "alembic": {"service"},
}
# and the modules of that floor that may: the glue that talks to Ray (capture.find.ray_workers,
# what Ray's answers mean, stays free of it)
RAY_USERS = {"hangdoc.capture.find.ray_job", "hangdoc.fleet.ray_agents", "hangdoc.ray"}
STUB_USERS = {"hangdoc.fleet.wire", "hangdoc.fleet.agent", "hangdoc.fleet.client"}
# capture/'s rooms: find/ finds a job's ranks on the node, read/ reads evidence from the live
# ranks, dumps/ reads the dump files a user already has, for `hangdoc analyze`. What each may
# import of the others (besides itself and the ground floor): find/ and read/ know nothing of
# each other or of the dumps; the dumps are read with what they know (py-spy's words, the
# flight recorder's format, a rank's environment, redaction). hangdoc.capture imports nothing.
ROOMS = {"find": set[str](), "read": set[str](), "dumps": {"find", "read"}}
# the floors outside capture/ that may import a room, where not every floor above may: the
# offline dumps are `hangdoc analyze`'s, never an agent's or a diagnosis's
ROOM_USERS = {"dumps": {"cli", "api"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> str:
    if module in GROUND:
        return "ground"
    parts = module.split(".")
    if parts[1] in ("capture", "fleet", "analysis", "report", "watch", "pipeline", "ray", "service", "api"):
        return parts[1]
    # settings: option defaults, and completion: the shells' scripts, both at the CLI's door
    if parts[1] in ("cli", "cliargs", "settings", "completion", "__main__"):
        return "cli"
    raise AssertionError(f"{module} belongs to no floor: add it to the rules and docs/architecture.md")


def room(module: str) -> str | None:
    """The room of capture/ a capture module is in; None for the package itself."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else None


def is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _eager(tree: ast.Module) -> list[ast.AST]:
    """The statements that run when the module is imported: its top level, outside
    functions and ``if TYPE_CHECKING:``, and the ``else:`` of such an ``if``."""
    nodes: list[ast.AST] = []
    for stmt in tree.body:
        if _is_type_checking(stmt):
            assert isinstance(stmt, ast.If)
            nodes += stmt.orelse if not any(isinstance(s, ast.FunctionDef) for s in stmt.orelse) else []
        elif not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            nodes.append(stmt)
    return nodes


def imports_of(path: Path, eager: bool = False) -> set[str]:
    """Every module ``path`` imports: hangdoc modules by full name, others by their name;
    ``eager``: only those imported at its top level when it is itself imported."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in (n for top in (_eager(tree) if eager else [tree]) for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:  # ``from . import wire`` imports a module
                if is_module(f"{target}.{alias.name}"):
                    found.add(f"{target}.{alias.name}")
    return found - {me}


def package_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts)


GRAPH = {module_name(p): imports_of(p) for p in package_sources()}


def internal(names: set[str]) -> set[str]:
    return {n for n in names if n == "hangdoc" or n.startswith("hangdoc.")}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_run_down_the_pipeline(module: str) -> None:
    mine = floor(module)
    allowed = MAY_IMPORT[mine] | {mine}
    also = MAY_ALSO_IMPORT.get(mine, set()) | LAZY.get(module, set())
    wrong = sorted(
        name
        for name in internal(GRAPH[module]) - also
        if not name.startswith("hangdoc.fleet.v1") and floor(name) not in allowed
    )
    assert wrong == [], f"{module} ({mine}) may import only {sorted(allowed)}"


def test_the_package_root_imports_only_the_heartbeat() -> None:
    # ``import hangdoc`` in a training script must stay free of every dependency
    root = PACKAGE / "__init__.py"
    assert internal(imports_of(root, eager=True)) == {"hangdoc.heartbeat"}
    assert imports_of(root, eager=True) <= {"hangdoc.heartbeat", "typing"}
    assert internal(GRAPH["hangdoc"]) == {"hangdoc.heartbeat", *LAZY["hangdoc"]}
    assert internal(GRAPH["hangdoc.heartbeat"]) == set()


def test_the_lazy_imports_are_lazy() -> None:
    for module, names in LAZY.items():
        path = PACKAGE / "__init__.py" if module == "hangdoc" else PACKAGE.parent / f"{module.replace('.', '/')}.py"
        assert names <= GRAPH[module] and not names & imports_of(path, eager=True), module


@pytest.mark.parametrize("module", sorted(HOMES))
def test_the_ground_floor_homes_import_only_the_standard_library(module: str) -> None:
    outside = sorted(
        name for name in GRAPH[module] if name != "__future__" and name.split(".")[0] not in sys.stdlib_module_names
    )
    assert outside == [], f"{module} imports {outside}"


def test_ray_only_in_its_glue() -> None:
    users = {m for m, names in GRAPH.items() if any(n == "ray" or n.startswith("ray.") for n in names)}
    assert users <= RAY_USERS, sorted(users - RAY_USERS)


def test_generated_stubs_only_behind_the_wire() -> None:
    users = {m for m, names in GRAPH.items() if any(n.startswith("hangdoc.fleet.v1") for n in names)}
    assert users <= STUB_USERS


@pytest.mark.parametrize("third_party", sorted(ONLY_IN))
def test_third_party_stays_on_its_floor(third_party: str) -> None:
    users = {m for m, names in GRAPH.items() if any(n == third_party or n.startswith(third_party + ".") for n in names)}
    assert {floor(m) for m in users} <= ONLY_IN[third_party], sorted(users)


def test_bundle_files_import_only_those_below() -> None:
    files = sorted(p.stem for p in (PACKAGE / "bundle").glob("*.py") if p.stem != "__init__")
    assert files == sorted(BUNDLE), "place each file of hangdoc/bundle/ in BUNDLE"
    for i, name in enumerate(BUNDLE):
        module = f"hangdoc.bundle.{name}"
        mine = {n for n in internal(GRAPH[module]) if n == "hangdoc.bundle" or n.startswith("hangdoc.bundle.")}
        below = {f"hangdoc.bundle.{lower}" for lower in BUNDLE[:i]}
        assert mine <= below, f"{module} imports {sorted(mine - below)}, not below it"


def test_every_capture_module_is_in_a_room() -> None:
    loose = sorted(m for m in GRAPH if floor(m) == "capture" and m != "hangdoc.capture" and room(m) not in ROOMS)
    assert loose == [], "place each module of hangdoc/capture/ in find/, read/ or dumps/ (ROOMS)"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if floor(m) == "capture"))
def test_capture_rooms_import_one_way(module: str) -> None:
    mine = room(module)
    allowed = {mine} | ROOMS[mine] if mine is not None else set()
    wrong = sorted(name for name in internal(GRAPH[module]) if floor(name) == "capture" and room(name) not in allowed)
    assert wrong == [], f"{module} may import of capture/ only {sorted(allowed)}"


@pytest.mark.parametrize("name", sorted(ROOM_USERS))
def test_a_room_is_imported_only_by_its_floors(name: str) -> None:
    users = {
        m
        for m, names in GRAPH.items()
        if floor(m) != "capture" and any(floor(n) == "capture" and room(n) == name for n in internal(names))
    }
    assert {floor(m) for m in users} <= ROOM_USERS[name], sorted(users)


REPORTERS = "hangdoc.report"


def sibling_privates(source: str, module: str) -> list[str]:
    """The ``_private`` names that ``module`` (a module of ``REPORTERS``, its ``source``)
    takes from another module there: ``from .terminal import _fold``, and
    ``terminal._fold`` where ``terminal`` names a sibling module. What reporters share
    lives under a public name in a module of its own (``rows``, ``frames``)."""
    package = module.rpartition(".")[0]
    tree = ast.parse(source)
    siblings: set[str] = set()  # local names bound to a sibling module
    found: list[str] = []

    def sibling(name: str) -> bool:
        return name.startswith(REPORTERS + ".") and name != module

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            for alias in node.names:
                if is_module(f"{target}.{alias.name}") and sibling(f"{target}.{alias.name}"):
                    siblings.add(alias.asname or alias.name)
                elif sibling(target) and alias.name.startswith("_"):
                    found.append(f"{target}.{alias.name}")
        elif isinstance(node, ast.Import):
            siblings.update(alias.asname for alias in node.names if alias.asname and sibling(alias.name))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in siblings
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith(REPORTERS + ".")))
def test_no_reporter_takes_a_private_name_of_another(module: str) -> None:
    path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    assert sibling_privates(path.read_text(), module) == [], f"{module}: share it under a public name"


def test_the_private_name_rule_sees_what_it_forbids() -> None:
    me = "hangdoc.report.html"
    assert sibling_privates("from .terminal import _fold, render", me) == ["hangdoc.report.terminal._fold"]
    assert sibling_privates("from hangdoc.report.graph import _svg", me) == ["hangdoc.report.graph._svg"]
    assert sibling_privates("from . import terminal\nterminal._state(1)", me) == ["terminal._state"]
    assert sibling_privates("import hangdoc.report.terminal as t\nt._fold([])", me) == ["t._fold"]
    # public names, the module's own private names, and other floors' are no concern here
    assert sibling_privates("from .rows import rank_rows\nfrom ..errors import printable", me) == []
    assert sibling_privates("from .html import _esc", me) == []


def test_no_import_circles() -> None:
    graph = nx.DiGraph()
    for module, names in GRAPH.items():
        graph.add_node(module)
        # a package imports its own submodules to re-export them; that is no circle
        graph.add_edges_from((module, n) for n in internal(names) if n in GRAPH and not n.startswith(module + "."))
    cycles = list(nx.simple_cycles(graph))
    assert cycles == []


def test_the_rules_see_every_import() -> None:
    # the walk above must not be blind: these edges exist and are allowed
    assert "hangdoc.model" in GRAPH["hangdoc.analysis.analyse"]
    assert "hangdoc.fleet.wire" in GRAPH["hangdoc.fleet.agent"]
    assert "networkx" in GRAPH["hangdoc.analysis.merge"]
    assert floor("hangdoc.report.terminal") == "report"
    assert {"hangdoc.bundle.files", "hangdoc.bundle.codec"} <= GRAPH["hangdoc.bundle.reader"]
    assert "hangdoc" in GRAPH["hangdoc.bundle.writer"]  # from .. import __version__
    assert "ray.util" in GRAPH["hangdoc.capture.find.ray_job"]  # inside a function
    assert "hangdoc.capture.read.pyspy" in GRAPH["hangdoc.capture.dumps.dumped"]  # from ..read
    assert "hangdoc.capture.dumps.dumpfile" in GRAPH["hangdoc.cli"]
    assert room("hangdoc.capture.find.discover") == "find"
    assert "ipaddress" in GRAPH["hangdoc.addresses"]
    assert floor("hangdoc.api") == "api" and "hangdoc.pipeline" in GRAPH["hangdoc.api"]  # inside a function
    assert "hangdoc.capture.dumps.dumpfile" in GRAPH["hangdoc.api"]


def test_every_module_imports_without_ray() -> None:
    """Ray is an optional extra: with ``import ray`` failing, every hangdoc module imports
    and the CLI answers; only a ray: job asks for Ray (then RayNotInstalled, exit 4)."""
    import subprocess

    # alembic runs the migrations' env.py itself, inside its context: importing it alone fails
    skipped = {"hangdoc.__main__", "hangdoc.service.migrations.env"}
    modules = sorted(m for m in GRAPH if not m.startswith("hangdoc.fleet.v1") and m not in skipped)
    script = (
        "import importlib, sys\n"
        "sys.modules['ray'] = None\n"  # import ray -> ImportError
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "assert 'ray' in sys.modules and sys.modules['ray'] is None\n"
        "from hangdoc.cli import main\n"
        "sys.exit(main(['diagnose', 'ray:raysubmit_x']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
    )
    assert done.returncode == 4, done.stderr
    assert "hangdoc[ray]" in done.stderr and "Traceback" not in done.stderr
