"""The shipped Grafana dashboard reads only metrics the router exports (a rename breaks it here, not in Grafana)."""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "cluster" / "grafana" / "lengthserve-dashboard.json"


def test_every_panel_queries_a_metric_the_router_declares():
    declared = set(re.findall(r'"(lengthserve_[a-z_]+)"', (REPO / "router" / "serving" / "telemetry.py").read_text()))
    declared |= {f"lengthserve_live_{f}" for f in ("mae_tokens", "signed_error_tokens", "pool_accuracy", "concordance")}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert panels
    for panel in panels:
        for target in panel["targets"]:
            names = re.findall(r"ray_(lengthserve_[a-z_]+)", target["expr"])
            assert names, target["expr"]
            for name in names:  # Ray exports with the ray_ prefix; counters end in _total, histograms in _bucket
                base = re.sub(r"_(total|bucket|sum|count)$", "", name)
                assert base in declared, (panel["title"], name)
