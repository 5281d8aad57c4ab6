"""The import wall (docs/architecture.md, "Import rules"): a service package imports another service only
through that service's client modules, shared/ imports (or names, as a module path) no service at all,
nothing but the launcher imports the launcher, no service imports the front door (jetrl_api), and nothing
shipped imports testkit/ (test support, not in the wheel). Every .py file of every service package and of shared/ is parsed (ast), so
imports inside functions count too, and so do `importlib.import_module("...")` calls with a literal name.
launcher/, bench/, multihost/, tests/ and examples/ may import anything."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("controller", "rollout_service", "reward_service", "trainer_service", "weight_store", "tracker")
LAUNCHER = "launcher"
FRONT_DOOR = "jetrl_api"
TESTKIT = "testkit"  # test and bench support, not in the wheel: nothing shipped may import it

# What crosses a service boundary in code: modules that speak only the wire protocol (or, for
# reward_service.local_client, the same interface in process) and the contracts. The one list; the
# same list is in docs/architecture.md (checked below).
CLIENT_MODULES = frozenset({
    "reward_service.client",  # RewardClient.score over NATS request/reply
    "reward_service.local_client",  # LocalRewardClient.score: the same, scored in this process
    "rollout_service.engines",  # make_engine + the Engine interface: the reward service's LLM judge runs one
    "weight_store.client",  # WeightStoreClient: publish_version, fetch
    "weight_store.announce",  # the weights KV: announce (CAS), latest, watch
    "weight_store.manifest",  # the manifest format and the store's directory layout
    "weight_store.verify",  # StoreCheck: is an announced version in the store with the announced manifest?
})


def _resolve(root: Path, node: ast.ImportFrom, alias: ast.alias) -> str:
    """The module a `from X import Y` brings in: X.Y when Y is a submodule (a file or package), else X."""
    sub = f"{node.module}.{alias.name}"
    path = root / sub.replace(".", "/")
    return sub if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() else node.module


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, wherever it sits."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, _resolve(root, node, a)) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            out.append((node.lineno, node.args[0].value))
    return sorted(set(out))


def named_modules(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal that is exactly a dotted module name of a service or the
    launcher ("weight_store.cli"): a module imported by name later, as shared/cli.py used to."""
    tops = (*SERVICES, LAUNCHER)
    return sorted({(n.lineno, n.value) for n in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and n.value.split(".")[0] in tops and "." in n.value
                   and all(part.isidentifier() for part in n.value.split("."))})


def violation(owner: str, module: str) -> str | None:
    """Why package `owner` may not import `module` (None: it may)."""
    top = module.split(".")[0]
    if top == owner:
        return None
    if top == TESTKIT:
        return "testkit is not shipped (tests/, bench/ and multihost/ only)"
    if owner == LAUNCHER:  # it starts every service: anything shipped
        return None
    if top == LAUNCHER:
        return "nothing but the launcher imports the launcher"
    if top == FRONT_DOOR:
        return "jetrl_api is users' front door: it re-exports the services, so they never import it"
    if owner == FRONT_DOOR:  # it re-exports what users extend, wherever it lives
        return None
    if top not in SERVICES:
        return None
    if owner == "shared":
        return "shared/ imports no service"
    if module not in CLIENT_MODULES:
        return "not a client module (a service imports another only through CLIENT_MODULES)"
    return None


def wall_violations(root: Path = ROOT) -> list[str]:
    found = []
    for owner in (*SERVICES, "shared", LAUNCHER, FRONT_DOOR):
        for path in sorted((root / owner).rglob("*.py")):
            for line, module in imported_modules(path, root):
                why = violation(owner, module)
                if why:
                    found.append(f"{path.relative_to(root)}:{line} imports {module}: {why}")
            if owner == "shared":
                found += [f"{path.relative_to(root)}:{line} names {text}: shared/ names no service"
                          for line, text in named_modules(path)]
    return found


def test_no_service_reaches_into_another_and_shared_names_none():
    assert wall_violations() == []


@pytest.mark.parametrize("owner,module,allowed", [
    ("rollout_service", "reward_service.client", True),
    ("rollout_service", "reward_service.engine", False),
    ("trainer_service", "weight_store.storage", False),
    ("trainer_service", "weight_store.transfer", False),
    ("rollout_service", "weight_store.server", False),
    ("controller", "rollout_service.evaluation.session", False),
    ("controller", "launcher.up", False),
    ("shared", "weight_store.client", False),
    ("shared", "launcher.cli", False),
    ("rollout_service", "jetrl_api", False),
    ("shared", "jetrl_api", False),
    ("launcher", "testkit.fault_scenario", False),
    ("controller", "testkit.devpg", False),
    ("launcher", "rollout_service.evaluation", True),
    ("jetrl_api", "rollout_service.workflows.base", True),
    ("weight_store", "weight_store.storage", True),
    ("rollout_service", "shared.contract.bus", True),
    ("trainer_service", "torch", True),
])
def test_the_rules(owner, module, allowed):
    assert (violation(owner, module) is None) == allowed


def test_finds_imports_inside_functions_from_imports_and_import_module(tmp_path):
    svc = tmp_path / "trainer_service"
    (tmp_path / "weight_store").mkdir()
    (tmp_path / "weight_store" / "storage.py").write_text("")
    svc.mkdir()
    (svc / "x.py").write_text(
        "import importlib\n"
        "def f():\n"
        "    from weight_store.storage import MANIFEST\n"
        "def g():\n"
        "    importlib.import_module('reward_service.engine')\n")
    (tmp_path / "weight_store" / "client.py").write_text("")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "y.py").write_text("from weight_store import client\nCLIS = ['reward_service.cli']\n")
    assert [v.split(": ")[0] for v in wall_violations(tmp_path)] == [
        "trainer_service/x.py:3 imports weight_store.storage", "trainer_service/x.py:5 imports reward_service.engine",
        "shared/y.py:1 imports weight_store.client", "shared/y.py:2 names reward_service.cli"]


def test_the_client_modules_exist_and_architecture_md_lists_them():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for module in CLIENT_MODULES:
        path = module.replace(".", "/") + ".py"
        if not (ROOT / path).is_file():  # a package: its __init__ is the interface
            path = module.replace(".", "/") + "/__init__.py"
        assert (ROOT / path).is_file(), module
        assert f"`{path}`" in doc, f"docs/architecture.md does not list {module}"
