"""The layers import in data-flow order only, and no module imports itself back through others.

predictor <- router.scheduling <- router.serving <- router.api <- deployments <- benchmarks. Lower
layers never import higher ones: the predictor stands alone, the scheduling core is pure (no
asyncio, no Ray, no HTTP: the simulator runs it on a modelled clock), the serving path is free of
HTTP (unit-testable with fake handles), and only the API layer knows FastAPI. Checked twice: each
module's own imports (its source), and what a fresh interpreter actually loads for the two bottom
layers. A cycle anywhere (benchmarks included) means two modules that cannot be read, tested or
moved apart, so the whole tree's import graph is checked for one.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ["predictor", "router.scheduling", "router.serving", "router.api", "deployments"]  # bottom to top
PACKAGES = ["predictor", "router", "deployments", "cluster", "benchmarks"]
# What a layer may not name in its own imports, beyond the layers above it.
NOT_HERE = {"router.scheduling": {"asyncio", "ray", "fastapi", "starlette", "vllm"},
            "router.serving": {"fastapi", "starlette"}}


def _imports(path: Path) -> set[str]:
    """Every module a file names in an import (at any depth: a function-local import is one too)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _within(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


def _path(layer: str) -> Path:
    return REPO / layer.replace(".", "/")


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_nothing_above_it(layer):
    above = LAYERS[LAYERS.index(layer) + 1:] + ["benchmarks", "cluster"] + sorted(NOT_HERE.get(layer, ()))
    offenders = {}
    for path in _path(layer).rglob("*.py"):
        bad = sorted(n for n in _imports(path) if any(_within(n, a) for a in above))
        if bad:
            offenders[str(path.relative_to(REPO))] = bad
    assert not offenders, offenders


def _module_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a name that is a module's attribute counts as the module)."""
    files = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    return {mod: {m for n in _imports(path) if (m := resolve(n)) and m != mod} for mod, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_anywhere():
    graph = _module_graph()
    assert len(graph) > 100  # the whole tree was read, not one package
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


PROBE = r"""
import importlib, importlib.abc, pkgutil, sys

FORBIDDEN = set(sys.argv[2].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in FORBIDDEN or name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"{sys.argv[1]} must not import {name}")
        return None

sys.meta_path.insert(0, Refuse())
package = importlib.import_module(sys.argv[1])
names = sorted(m.name for m in pkgutil.iter_modules(package.__path__, sys.argv[1] + "."))
for name in names:
    importlib.import_module(name)
print(len(names))
"""
RUNTIME = {"predictor": "benchmarks,deployments,cluster,router,ray,vllm,fastapi",
           "router.scheduling": "benchmarks,deployments,cluster,router.api,router.serving,ray,vllm,fastapi,starlette"}


@pytest.mark.parametrize("layer", sorted(RUNTIME))
def test_the_bottom_layers_load_without_the_layers_above_ray_or_http(layer):
    out = subprocess.run([sys.executable, "-c", PROBE, layer, RUNTIME[layer]], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 5  # every module was tried, not an empty package


def test_the_probe_catches_a_forbidden_import():
    leaky = PROBE.replace("sys.meta_path.insert(0, Refuse())\n", "sys.meta_path.insert(0, Refuse())\nimport ray\n", 1)
    out = subprocess.run([sys.executable, "-c", leaky, "router.scheduling", RUNTIME["router.scheduling"]], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "must not import ray" in out.stderr
