"""The stack on a real 3-node Ray cluster (cluster.local): placement by node group, and a node failure.

Nodes: the head (proxy, router, the `short` pool) and two workers of the `pool_long` group, so the
`long` pool runs on one of them and the other stands by, as a second node of a scaled node group
would. Every node with engines advertises `engine_node`, where the predictor's replicas go (one per
node). Then the worker running `long` is killed mid-replay: every request of the replay must end as
a record (completed, or failed with an error), none lost, and the pool must come back on the
remaining worker and serve again.

Small on purpose (2 pools x 1 replica, 2 predictor replicas): it runs beside other work on 2 cores.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray
from openai import OpenAI
from ray import serve
from ray.util.placement_group import placement_group_table
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray.util.state import list_actors

from benchmarks.replay.actors import START_LEAD_S, ReplayActor, account, replay, spawn_actors
from benchmarks.replay.trace import build_trace
from cluster import local
from tests.stack import RunningStack

pytestmark = [pytest.mark.stack, pytest.mark.own_cluster]

APP = "lengthserve"
HEAD_ONLY = {"node:__internal_head__": 0.001}  # Ray gives the head node this resource
ARGS = {
    "pools": [
        {"name": "short", "node_group": "pool_short", "deployment": {"num_replicas": 1, "max_ongoing_requests": 8}},
        {"name": "long", "node_group": "pool_long", "deployment": {"num_replicas": 1, "max_ongoing_requests": 8}},
    ],
    "predictor": {"deployment": {
        "num_replicas": 2, "max_replicas_per_node": 1, "max_ongoing_requests": 32,
        "ray_actor_options": {"num_cpus": 0.2, "resources": {"engine_node": 0.001}},
    }},
    # round_robin: every other request goes to each pool, whatever the predictions (with the short
    # max_tokens here, estp would send nearly everything to `short`); routing is not tested here.
    "router": {
        "policy": "round_robin",
        "input_edges": [80],
        "deployment": {"ray_actor_options": {"num_cpus": 0.1, "resources": HEAD_ONLY}},
    },
}
RECOVERY_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def cluster():
    # A short root: Ray's socket paths under it must stay within the 107 characters Unix allows.
    root = Path(tempfile.mkdtemp(prefix="lsc-", dir="/tmp"))
    try:
        state = local.start(root, head_cpus=2, head_resources={"pool_short": 1, "engine_node": 1},
                            workers=[{"pool_long": 1, "engine_node": 1}] * 2, worker_cpus=2)
        ray.init(address=state.address, log_to_driver=False)
        with RunningStack(root, ARGS, ray_address=state.address) as stack:
            _wait_until_running()  # the stack answers once one pool is up; the tests need all
            yield state, stack
    finally:
        ray.shutdown()
        local.stop(root)


def _wait_until_running(timeout_s: float = RECOVERY_TIMEOUT_S) -> None:
    deadline = time.time() + timeout_s
    while (status := serve.status().applications[APP].status) != "RUNNING":
        if time.time() > deadline:
            raise TimeoutError(f"application {APP} is {status} after {timeout_s:.0f}s: {serve.status()}")
        time.sleep(3)


def _nodes() -> dict[str, dict]:
    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


def _replica_nodes(deployment: str) -> list[str]:
    # The connected cluster's address: the session stack's cluster may be up too, and Ray's
    # state API would refuse to guess between the two.
    actors = list_actors(address=ray.get_runtime_context().gcs_address,
                         filters=[("class_name", "=", f"ServeReplica:{APP}:{deployment}"), ("state", "=", "ALIVE")])
    return [a.node_id for a in actors]


def _pool_bundle(pool: str) -> tuple[dict, str]:
    """(resources, node id) of bundle 0 of the pool's live replica placement group."""
    prefix = f"SERVE_REPLICA::{APP}#pool-{pool}#"
    tables = [t for t in placement_group_table().values() if t["name"].startswith(prefix) and t["state"] == "CREATED"]
    assert len(tables) == 1, tables
    return tables[0]["bundles"][0], tables[0]["bundles_to_node_id"][0]


def _local_name(state: local.ClusterState, node_id: str) -> str:
    port = _nodes()[node_id]["NodeManagerPort"]
    return next(n.name for n in state.nodes if n.node_manager_port == port)


def _runs_an_engine(state: local.ClusterState, node_name: str) -> bool:
    """A vLLM engine process in the node's own process tree (under its raylet)."""
    titles = []
    for proc in local.node_processes(Path(state.root), node_name):
        try:
            titles.append(" ".join(proc.cmdline()))
        except psutil.Error:  # ended meanwhile
            pass
    return any("EngineCore" in title for title in titles)


def _wait_for_pool(pool: str, not_on: str | None = None, timeout_s: float = RECOVERY_TIMEOUT_S) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        nodes = [n for n in _replica_nodes(f"pool-{pool}") if n != not_on]
        if nodes and nodes[0] in _nodes():
            return nodes[0]
        time.sleep(3)
    raise TimeoutError(f"pool {pool} has no live replica after {timeout_s:.0f}s")


def test_pools_run_on_their_node_groups_with_a_predictor_per_engine_node(cluster):
    state, _ = cluster
    nodes = _nodes()
    placed = {}
    for pool, group in (("short", "pool_short"), ("long", "pool_long")):
        [replica_node] = _replica_nodes(f"pool-{pool}")
        bundle, bundle_node = _pool_bundle(pool)
        assert group in nodes[replica_node]["Resources"]
        assert bundle.get(group, 0) > 0 and bundle_node == replica_node  # the engine's bundle, same node
        assert _runs_an_engine(state, _local_name(state, replica_node))
        placed[pool] = replica_node
    assert placed["short"] != placed["long"]
    assert _local_name(state, placed["short"]) == "head"

    predictors = _replica_nodes("length-predictor")
    assert len(predictors) == 2 and len(set(predictors)) == 2
    assert all("engine_node" in nodes[n]["Resources"] for n in predictors)
    assert [_local_name(state, n) for n in _replica_nodes("Router")] == ["head"]
    print(f"\nmemory in use with the stack up: {psutil.virtual_memory().used / 2**30:.1f} GiB")


def test_requests_are_served_end_to_end_by_pools_on_different_nodes(cluster):
    _, stack = cluster
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    answer = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8,
    )
    assert answer.choices[0].message.content and answer.usage.completion_tokens > 0

    actors = spawn_actors(stack.base_url, num_actors=3, request_timeout_s=300)
    assert len(set(ray.get([a.node_id.remote() for a in actors]))) == min(3, len(_nodes()))  # one per node
    records = replay(stack.base_url, build_trace(n=16, rate=2.0, seed=0, max_tokens=32), actors=actors, timeout_s=300)
    assert all(r.status == "ok" and r.completion_tokens for r in records), [r.error for r in records if r.error]
    assert {r.pool for r in records} == {"short", "long"}


def test_removing_a_worker_mid_replay_loses_no_request_and_the_pool_recovers(cluster):
    state, stack = cluster
    victim_id = _wait_for_pool("long")
    victim = _local_name(state, victim_id)
    assert victim != "head"
    # Clients on the nodes that stay: a client dying with its machine is not what is tested here.
    survivors = [n for n in _nodes() if n != victim_id]
    actors = [ReplayActor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
              .remote(stack.base_url, stack.model, 300) for n in survivors]
    trace = build_trace(n=30, rate=1.0, seed=1, max_tokens=48)

    started = time.time()
    removed_at = {}

    def remove() -> None:
        removed_at["t"] = time.time()
        removed_at["processes"] = local.remove_worker(state, victim)

    timer = threading.Timer(10.0, remove)
    timer.start()
    records = replay(stack.base_url, trace, actors=actors, timeout_s=360)  # raises on any lost request
    timer.join()
    tally = account(trace, records)
    failed = [r for r in records if r.status == "failed"]
    print(f"\nnode {victim} removed ({removed_at['processes']} processes): {tally}; "
          f"errors: {sorted({r.error for r in failed})}")
    assert tally.lost == 0 and tally.sent == tally.completed + tally.failed == len(trace)
    assert all(r.error for r in failed)
    removal_s = removed_at["t"] - (started + START_LEAD_S)
    assert any(r.status == "ok" and r.sent_s > removal_s for r in records)  # service went on

    new_node = _wait_for_pool("long", not_on=victim_id)
    assert "pool_long" in _nodes()[new_node]["Resources"] and _local_name(state, new_node) != victim
    _wait_until_running()
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    by_id = {t.request_id: t for t in trace}
    long_prompts = [by_id[r.request_id].messages for r in records if r.pool == "long" and r.status == "ok"]
    assert long_prompts, "the replay sent nothing to the long pool"
    served_by = []
    for messages in long_prompts[:4]:  # round robin: every other one to `long`
        raw = client.chat.completions.with_raw_response.create(model=stack.model, messages=messages, max_tokens=16)
        assert raw.http_response.status_code == 200 and raw.parse().usage.completion_tokens > 0
        served_by.append(raw.headers.get("x-pool"))
    assert "long" in served_by, served_by
