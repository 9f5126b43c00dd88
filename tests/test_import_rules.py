"""What may import what, checked on the source so the structure cannot erode quietly.

- Layers: every module of hermes_bulk sits in one layer of LAYERS and imports only from its own
  layer or the ones below (imports under `if TYPE_CHECKING:` are annotations, not arrows).
- No cycles: no module imports one that imports it back, however many steps away, lazily or not.
- Owners: each heavy library has the modules that may import it (THIRD_PARTY); everything else
  reaches it through them, so the backends, the HTTP client and the terminal stay swappable.
- Start-up: `hermes_bulk.frontends.cli` loads none of them until a command needs one (`path`, `list`
  and `status` start without huey, redis, httpx, urllib3, tenacity, rich, the dashboard's starlette
  and uvicorn, which only `dashboard` loads, or pydantic: their settings are read by
  quick_settings when the environment leaves no doubt).
Hermes' own modules have their fence: tests/plugin/test_boundaries.py.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "hermes_bulk"

#: Lowest first. A module may import its own layer and the layers below it, never one above.
#: Finer than the layout table of docs/development.md (folders): the order of modules within them.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "leaves: the standard library only",
        (
            "errors",
            "words",
            "durations",
            "redact",
            "files",
            "full_disk",
            "broken_pipe",
            "usage",
            "credentials",
            "jobs.prompt",
            "jobs.model_options",
            "jobs.templates",
            "runtime.metrics",
            "frontends.terminal",
            "store",
            "store.protocol",
            "store.records",
            "store.limits_math",
            "store.claim_rule",
            "store.sqlite",
            "store.redis",
            "budget",
            "budget.policy",
            "budget.turns",
            "budget.windows",
            "testing",
            "testing.*",
            "plugin",
            "config",
            "fleet",
            "providers",
            "jobs",
            "frontends",
            "frontends.dashboard",
        ),
    ),
    (
        "configuration and where things are",
        ("", "config.*", "frontends.logs", "budget.settings", "budget.grammar", "budget.failopen"),
    ),
    (
        "one backend each: stores, queues, ledgers",
        (
            "store.compression",
            "store.sqlite.*",
            "store.redis.*",
            "budget.ledger",
            "budget.sqlite_ledger",
            "budget.redis_ledger",
            "budget.ledger_location",
        ),
    ),
    (
        "what an item goes through",
        (
            "providers.*",
            "runtime.breaker",
            "sources",
            "sources.*",
            "frontends.flag_files",
            "jobs.export",
            "jobs.hints",
            "jobs.prices",
            "jobs.bounds",
            "fleet.liveness",
            "fleet.endpoints",
            "fleet.tasks",
            "budget.service",
            "frontends.dashboard.access",
            "budget.gate",
            "budget.report",
        ),
    ),
    (
        "the backend from a URL, one item's life",
        (
            "fleet.broker",
            "runtime.saving",
            "runtime.sending",
            "runtime.pipeline",
            "runtime.batch_requests",
            "runtime.batch_faults",
            "runtime.batch_submit",
            "runtime.batch_poll",
            "runtime.batch_ingest",
            "runtime.batch_delete",
            "runtime.batch_driver",
        ),
    ),
    (
        "the service API and the grammar",
        (
            "jobs.request",
            "jobs.status",
            "jobs.creating",
            "jobs.life",
            "jobs.service",
            "frontends.values",
            "frontends.options",
            "frontends.grammar",
            "frontends.parser",
            "budget.commands",
        ),
    ),
    (
        "what runs and shows jobs",
        (
            "runtime",
            "runtime.worker_serving",
            "runtime.worker_maintenance",
            "runtime.worker_stop",
            "runtime.worker",
            "runtime.process",
            "frontends.views.times",
            "frontends.views.money",
            "frontends.views.items",
            "frontends.views.workers",
            "frontends.views.next_steps",
            "frontends.views.status",
            "frontends.views.create",
            "frontends.views.job_list",
            "frontends.views.progress",
            "frontends.views",
            "runtime.client_kinds",
            "frontends.dashboard.figures",
        ),
    ),
    ("the answers both front ends give", ("frontends.replies",)),
    (
        "front ends",
        (
            "frontends.waiting",
            "frontends.cli",
            "__main__",
            "plugin.*",
            "frontends.dashboard.app",
            "frontends.dashboard.serve",
        ),
    ),
]

#: The only modules that may import each library (relative to src/hermes_bulk).
THIRD_PARTY: dict[str, set[str]] = {
    "huey": {"fleet/tasks.py", "store/sqlite/queue.py", "store/redis/queue.py"},
    "redis": {
        "store/redis/connection.py",
        "store/redis/creation.py",
        "store/redis/durability.py",
        "store/redis/failover.py",
        "store/redis/jobs.py",
        "store/redis/queue.py",
        "store/redis/scripts.py",
        "budget/redis_ledger.py",
        "testing/sentinels.py",
    },
    "httpx": {
        "providers/transport.py",  # its certificate store only (create_ssl_context)
        "providers/deadline.py",  # a network backend bounding each call's total time
        "providers/batch_api.py",
        "providers/message_batches.py",
        "providers/doctor.py",
        "plugin/hermes.py",
    },
    "urllib3": {"providers/transport.py"},
    "httpcore": {"providers/deadline.py"},
    "zstandard": {"store/compression.py"},
    "jsonschema": {"providers/answers.py"},
    "referencing": {"providers/answers.py"},
    "tenacity": {"runtime/sending.py"},
    "rich": {"frontends/terminal.py", "frontends/views/progress.py"},
    "pydantic": {"config/settings.py", "budget/settings.py", "jobs/request.py"},
    "pydantic_settings": {"config/settings.py"},
    "starlette": {"frontends/dashboard/app.py"},
    "uvicorn": {"frontends/dashboard/serve.py"},
}


def module_name(path: Path) -> str:
    """`store.sqlite.jobs` for src/hermes_bulk/store/sqlite/jobs.py; "" for the package itself."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in SRC.rglob("*.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            hidden |= {id(child) for child in ast.walk(node)}
    return hidden


def _known(name: str) -> str | None:
    """The hermes_bulk module a dotted name (relative to the package) lands in."""
    known = modules()
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in known else None


@cache
def arrows() -> dict[str, set[str]]:
    """module -> the hermes_bulk modules it imports (module level or in functions)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        hidden = _type_checking_nodes(tree)
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                elif node.module and node.module.split(".")[0] == "hermes_bulk":
                    source = node.module.partition(".")[2]
                else:
                    continue
                for alias in node.names:  # `from . import x` imports the module x
                    sub = f"{source}.{alias.name}" if source else alias.name
                    targets.add(sub if sub in modules() else _known(source) or "")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "hermes_bulk":
                        targets.add(_known(alias.name.partition(".")[2]) or "")
        graph[name] = {t for t in targets if t != name}
    return graph


#: The page whose "## Layout" section holds the layout table and the long modules' concepts.
LAYOUT_DOC = SRC.parents[1] / "docs" / "development.md"


@cache
def layout_table() -> list[tuple[str, set[str], set[str]]]:
    """The layout table: (row, the folders and files it names, the rows it may import)."""
    text = LAYOUT_DOC.read_text()
    section = text[text.index("## Layout") :]
    rows: list[tuple[str, set[str], set[str]]] = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 3 or cells[0] in ("where", "---"):
            continue
        names = set(re.findall(r"`([^`]+)`", cells[0]))
        key = "ground" if cells[0].startswith("ground") else cells[0]
        if "everything above" in cells[2]:
            allowed = {k for k, _, _ in rows}
        else:
            allowed = {"ground"} if "ground" in cells[2] else set()
            allowed |= {k for k, n, _ in rows if n & set(re.findall(r"`([^`]+)`", cells[2]))}
        rows.append((key, names, allowed))
    return rows


def row_of(module: str) -> str:
    """The layout row of a module: its top folder's, or the row that names its file."""
    top = module.split(".")[0] if module else "__init__"
    entry = f"{top}/" if (SRC / top).is_dir() else f"{top}.py"
    found = [key for key, names, _ in layout_table() if entry in names]
    assert len(found) == 1, (
        f"{entry} is in {len(found)} rows of the layout table (docs/development.md); give it "
        "exactly one"
    )
    return found[0]


def test_the_layout_table_names_the_tree():
    tree = {f"{p.name}/" for p in SRC.iterdir() if (p / "__init__.py").exists()}
    tree |= {p.name for p in SRC.glob("*.py")}
    named = set().union(*(names for _, names, _ in layout_table()))
    assert (sorted(tree - named), sorted(named - tree)) == ([], [])


def test_imports_follow_the_layout_table():
    allowed = {key: may | {key} for key, _, may in layout_table()}
    wrong = sorted(
        f"{name or '__init__'} ({row_of(name)}) imports {target} ({row_of(target)})"
        for name, targets in arrows().items()
        for target in targets
        if row_of(target) not in allowed[row_of(name)]
    )
    assert wrong == []


#: The modules that speak to a provider over the network (the rest of providers/ only checks
#: what a provider said, or paces requests).
SPEAKERS = {
    "providers.client",
    "providers.anthropic",
    "providers.batch_api",
    "providers.doctor",
}


def reaches(name: str) -> set[str]:
    """Every module name imports, however many steps away."""
    seen, stack = set(), [name]
    while stack:
        for target in arrows()[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def test_the_jobs_api_speaks_to_no_provider():
    # Front ends hand Jobs the batch canceller (runtime.cancel_batches) that delete needs.
    assert {
        name: sorted(reaches(name) & SPEAKERS) for name in modules() if name.startswith("jobs")
    } == {name: [] for name in modules() if name.startswith("jobs")}


def test_a_planted_import_against_the_table_is_caught(monkeypatch):
    real = arrows()
    planted = {**real, "providers.client": real["providers.client"] | {"jobs.service"}}
    monkeypatch.setattr(sys.modules[__name__], "arrows", lambda: planted)
    with pytest.raises(
        AssertionError, match=r"providers.client \(`providers/`\) imports jobs.service"
    ):
        test_imports_follow_the_layout_table()


def layer_of(name: str) -> int:
    found = [
        i
        for i, (_, patterns) in enumerate(LAYERS)
        if any(fnmatch.fnmatchcase(name, p) for p in patterns)
    ]
    assert len(found) == 1, (
        f"hermes_bulk.{name} is in {len(found)} layers of LAYERS; give it exactly one"
    )
    return found[0]


def test_every_module_has_one_layer():
    for name in modules():
        layer_of(name)


def test_imports_point_down_the_layers():
    upward = [
        f"{name or 'hermes_bulk'} ({LAYERS[layer_of(name)][0]}) imports {target} "
        f"({LAYERS[layer_of(target)][0]})"
        for name, targets in arrows().items()
        for target in targets
        if layer_of(target) > layer_of(name)
    ]
    assert upward == []


def test_no_module_imports_one_that_imports_it_back():
    graph, cycles = arrows(), []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            name, path = stack.pop()
            for target in graph[name]:
                if target == start:
                    cycles.append(" -> ".join([*path, start]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    assert cycles == []


def test_each_library_is_imported_only_by_its_owners():
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        hidden = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for name in names:
                owners = THIRD_PARTY.get(name.split(".")[0])
                if owners is not None and rel not in owners:
                    offenders.append(f"{rel}:{node.lineno} imports {name}")
    assert offenders == []


def test_a_planted_upward_import_and_cycle_are_caught(monkeypatch):
    # The checks above must be able to fail: jobs (the service API) importing cli closes a loop.
    real = arrows()
    planted = {**real, "jobs.service": real["jobs.service"] | {"frontends.cli"}}
    monkeypatch.setattr(sys.modules[__name__], "arrows", lambda: planted)
    with pytest.raises(AssertionError, match="jobs.service .* imports frontends.cli"):
        test_imports_point_down_the_layers()
    with pytest.raises(AssertionError, match="frontends.cli -> .*jobs.service"):
        test_no_module_imports_one_that_imports_it_back()


@pytest.mark.parametrize("command", ["path", "list", "status"])
def test_a_read_command_starts_without_the_heavy_libraries(command, tmp_path):
    code = (
        "import json, sys\nfrom hermes_bulk.frontends import cli\nstatus = "
        "cli.main([sys.argv[1]])\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    # A user's environment as the docs set it up: the endpoint, the key, a model, a limit.
    env = {
        "HERMES_BULK_HOME": str(tmp_path / "home"),
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "sk-not-a-key",
        "HERMES_BULK_MODEL": "gpt-4o-mini",
        "HERMES_BULK_MAX_CONCURRENCY": "32",
        "HERMES_BULK_REUSE": "false",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, command], capture_output=True, text=True, env=env, timeout=60
    )
    modules = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    heavy = {
        "huey",
        "redis",
        "httpx",
        "urllib3",
        "tenacity",
        "rich",
        "starlette",
        "uvicorn",
        "anyio",
        "zstandard",
        "pydantic",
        "pydantic_settings",
        "pydantic_core",
        "jsonschema",
        "referencing",
    }
    assert {m.split(".")[0] for m in modules} & heavy == set(), proc.stdout
    # Nor the parts of hermes-bulk only other commands use: discovery (create), the export
    # writer, the cron budget (its gate is looked up when a running job's status asks it), and
    # the rooms of create, a job's life and watching one (docs/benchmarks.md, row 7).
    unused = {
        "hermes_bulk.sources",
        "hermes_bulk.jobs.export",
        "hermes_bulk.runtime.pipeline",
        "hermes_bulk.jobs.creating",
        "hermes_bulk.jobs.life",
        "hermes_bulk.jobs.request",
        "hermes_bulk.frontends.waiting",
        "hermes_bulk.frontends.views.create",
        "hermes_bulk.frontends.views.progress",
    }
    assert modules & unused == set() and not any(
        m.startswith("hermes_bulk.budget") for m in modules
    ), sorted(m for m in modules if m in unused or m.startswith("hermes_bulk.budget"))


def private_reaches(tree: ast.AST) -> list[str]:
    """`module._name` and `from hermes_bulk.x import _name` in a test, of hermes_bulk's modules."""
    modules_here: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hermes_bulk"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {node.module} import {alias.name}")
                modules_here.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules_here |= {
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.startswith("hermes_bulk")
            }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules_here
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return found


def test_no_test_reaches_into_a_private_name_of_hermes_bulk():
    tests = Path(__file__).resolve().parent
    reached = {
        str(p.relative_to(tests)): hits
        for p in sorted(tests.rglob("*.py"))
        if (hits := private_reaches(ast.parse(p.read_text())))
    }
    assert reached == {}


def test_a_planted_private_reach_is_caught():
    planted = "from hermes_bulk.fleet import broker\nbroker._build('sqlite:///x')\n"
    assert private_reaches(ast.parse(planted)) == ["broker._build (line 2)"]


#: Above this many lines a module names its one concept in docs/development.md's layout section.
LONG_MODULE_LINES = 400


def test_every_module_over_400_lines_names_its_one_concept_in_the_layout_section():
    text = LAYOUT_DOC.read_text()
    section = text[text.index("Modules over 400 lines") :].split("\n\n", 2)[1]
    named = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([^`]+)` \| (.+) \|$", section, re.M)
    }
    long = {
        p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*.py")
        if len(p.read_text().splitlines()) > LONG_MODULE_LINES
    }
    assert (sorted(long - set(named)), [m for m in named if not (SRC / m).exists()]) == ([], [])
    assert all(named.values())
