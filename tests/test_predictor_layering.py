"""predictor/ stands alone: it imports nothing from benchmarks/, deployments/ or router/.

The prediction deployment and the benchmarks both build on the predictor; if it reached back
into them, serving would drag in the benchmark code (and its dependencies) or break without it.
A fresh interpreter refuses those packages outright and imports every predictor module.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = r"""
import importlib, importlib.abc, pkgutil, sys

FORBIDDEN = {"benchmarks", "deployments", "router"}

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"predictor must not import {name}")
        return None

sys.meta_path.insert(0, Refuse())
import predictor
names = sorted(m.name for m in pkgutil.iter_modules(predictor.__path__, "predictor."))
for name in names:
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
assert not leaked, leaked
print(len(names))
"""


def test_every_predictor_module_imports_without_benchmarks_deployments_or_router():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 10  # every module was tried, not an empty package


def test_the_probe_catches_a_forbidden_import():
    leaky = PROBE.replace("import predictor\n", "import predictor\nimport router.length_bins\n", 1)
    out = subprocess.run([sys.executable, "-c", leaky], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "must not import router" in out.stderr
