"""The shape of the tree (docs/architecture.md, "Layout"): no import circle among the project's modules,
a contract and a config that import no torch, a description on every setting, and every extension point a
user needs importable from the front door (jetrl_api)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel
from test_import_wall import ROOT, imported_modules

from shared.config import JetrlConfig

PACKAGES = ("jetrl_api", "shared", "controller", "rollout_service", "reward_service", "trainer_service",
            "weight_store", "tracker", "launcher")


def module_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports (imports inside functions count; package __init__s do not
    import their submodules implicitly)."""
    files = {}
    for top in packages:
        for f in (root / top).rglob("*.py"):
            name = ".".join(f.relative_to(root).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = f
    return {m: {i for _, i in imported_modules(f, root) if i in files and i != m} for m, f in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_module_imports_itself_round_a_circle():
    # the benchmarks and test support too (bench/weight_sync.py and bench/weight_fanout.py once imported
    # each other; what both need is in bench/weights_common.py)
    assert circles(module_graph(packages=(*PACKAGES, "bench", "multihost", "testkit"))) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_contract_and_the_config_import_no_torch():
    mods = [".".join(p.relative_to(ROOT).with_suffix("").parts)
            for d in ("shared/contract", "shared/config") for p in sorted((ROOT / d).glob("*.py"))]
    code = (f"import importlib, sys\nfor m in {mods!r}: importlib.import_module(m.removesuffix('.__init__'))\n"
            "from shared.config import JetrlConfig; JetrlConfig()\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _settings(model: type[BaseModel], prefix: str = ""):
    for name, f in model.model_fields.items():
        yield f"{prefix}{name}", f
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _settings(ann, f"{prefix}{name}.")


def test_every_setting_has_a_description():
    settings = list(_settings(JetrlConfig))
    assert len(settings) > 250
    sections = {n for n, f in settings if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}
    missing = [n for n, f in settings if n not in sections and not (f.description or "").strip()]
    assert missing == []


def test_the_front_door_holds_every_extension_point():
    import jetrl_api

    for name in ("Workflow", "WorkflowContext", "Trace", "PromptTask", "Sample", "Tool", "ToolError", "Score",
                 "ScorerFn", "serve_agent", "Engine", "GenerateRequest", "GenerateResult", "SamplingParams",
                 "load_ref"):
        assert hasattr(jetrl_api, name), name
    assert sorted(jetrl_api.__all__) == sorted(set(jetrl_api.__all__))
    assert all(hasattr(jetrl_api, n) for n in jetrl_api.__all__)


def test_load_ref_names_the_setting_in_every_error(tmp_path):
    import pytest

    from shared.runtime.refs import RefError, load_ref

    assert load_ref("shared.runtime.refs:load_ref") is load_ref
    (tmp_path / "mine.py").write_text("def f():\n    return 7\n")
    assert load_ref(f"{tmp_path / 'mine.py'}:f")() == 7
    for ref, why in [("nocolon", "write it as"), ("no_such_pkg_xyz:f", "no module named"),
                     ("shared.runtime.refs:nope", "has no attribute"), (f"{tmp_path}/none.py:f", "does not exist")]:
        with pytest.raises(RefError, match=why) as e:
            load_ref(ref, "reward.scorer")
        assert str(e.value).startswith(f"reward.scorer={ref!r}")

    class Mine(ValueError):
        pass

    with pytest.raises(Mine):
        load_ref("nocolon", "x", Mine)
