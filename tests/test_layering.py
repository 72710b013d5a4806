"""The layers import in data-flow order only: predictor <- scheduling <- serving <- api <- deployments.

Lower layers never import higher ones (nor benchmarks/): the predictor stands alone, the
scheduling core is pure (no asyncio, no Ray, no HTTP: the simulator runs it on a modelled clock),
the serving path is free of HTTP (unit-testable with fake handles), and only the API layer knows
FastAPI. Checked twice: each module's own imports (its source), and what a fresh interpreter
actually loads for the two bottom layers.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ["predictor", "scheduling", "serving", "api", "deployments"]  # bottom to top
# What a layer may not name in its own imports, beyond the layers above it.
NOT_HERE = {"scheduling": {"asyncio", "ray", "fastapi", "starlette", "vllm"}, "serving": {"fastapi", "starlette"}}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_nothing_above_it(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1:]) | {"benchmarks", "router"} | NOT_HERE.get(layer, set())
    offenders = {str(path.relative_to(REPO)): sorted(_imports(path) & above)
                 for path in (REPO / layer).rglob("*.py") if _imports(path) & above}
    assert not offenders, offenders


PROBE = r"""
import importlib, importlib.abc, pkgutil, sys

FORBIDDEN = set(sys.argv[2].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"{sys.argv[1]} must not import {name}")
        return None

sys.meta_path.insert(0, Refuse())
package = importlib.import_module(sys.argv[1])
names = sorted(m.name for m in pkgutil.iter_modules(package.__path__, sys.argv[1] + "."))
for name in names:
    importlib.import_module(name)
print(len(names))
"""
RUNTIME = {"predictor": "benchmarks,deployments,api,serving,scheduling,router,ray,vllm,fastapi",
           "scheduling": "benchmarks,deployments,api,serving,router,ray,vllm,fastapi,starlette"}


@pytest.mark.parametrize("layer", sorted(RUNTIME))
def test_the_bottom_layers_load_without_the_layers_above_ray_or_http(layer):
    out = subprocess.run([sys.executable, "-c", PROBE, layer, RUNTIME[layer]], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 5  # every module was tried, not an empty package


def test_the_probe_catches_a_forbidden_import():
    leaky = PROBE.replace("sys.meta_path.insert(0, Refuse())\n", "sys.meta_path.insert(0, Refuse())\nimport ray\n", 1)
    out = subprocess.run([sys.executable, "-c", leaky, "scheduling", RUNTIME["scheduling"]], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "must not import ray" in out.stderr
