"""Readiness from Ray Serve's view of the deployments the router needs (no cluster)."""

import asyncio
from types import SimpleNamespace

from router.serving import readiness
from router.serving.readiness import Readiness


def _status(states: dict[str, dict]):
    deployments = {name: SimpleNamespace(replica_states=s) for name, s in states.items()}
    return SimpleNamespace(applications={"app": SimpleNamespace(deployments=deployments)})


def test_ready_only_while_every_pool_and_the_predictor_have_a_running_replica(monkeypatch):
    handles = [SimpleNamespace(app_name="app", deployment_name=name) for name in ("pool-a", "length-predictor")]
    states = {"pool-a": {"STARTING": 2}, "length-predictor": {"RUNNING": 1}}
    monkeypatch.setattr(readiness.serve, "status", lambda: _status(states))
    check = Readiness(handles, ttl_s=0)
    assert not asyncio.run(check.ready())  # the router is up, the engines are still starting
    assert asyncio.run(check.running()) == {"pool-a": 0, "length-predictor": 1}
    states["pool-a"] = {"RUNNING": 1, "STARTING": 1}
    assert asyncio.run(check.ready())
    states.pop("length-predictor")  # a deployment Serve no longer reports is not up
    assert not asyncio.run(check.ready())
