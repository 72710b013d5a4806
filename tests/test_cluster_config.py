"""Cluster placement without a cluster: config -> deployment options, and the GPU cluster files.

The launcher YAML and the KubeRay manifest cannot run here; these tests keep them honest instead:
their Serve config validates, is the same in both, has the shape of ray_config.yaml (so a key added
there is not forgotten here), and every resource it asks for is advertised by some node.
"""

import json
from pathlib import Path

import pytest
import yaml

from cluster.local import parse_worker
from deployments.app import _build_predictor
from router.serving.config import PoolSpec, StackConfig
from deployments.engine_pool import NODE_GROUP_SHARE, engine_bundle, llm_config

REPO = Path(__file__).resolve().parent.parent
GPU_SERVE = REPO / "cluster" / "ray_config.gpu.yaml"
KUBERAY = REPO / "cluster" / "kuberay-rayservice.yaml"
LAUNCHER = REPO / "cluster" / "ray-cluster-gpu.yaml"
HEAD_RESOURCE = "node:__internal_head__"  # Ray gives every head node this one


def _serve(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _args(serve_config: dict) -> dict:
    return serve_config["applications"][0]["args"]


def _kuberay() -> dict:
    return yaml.safe_load(KUBERAY.read_text())


def test_a_pinned_pool_puts_its_replica_and_engine_on_its_node_group():
    config = StackConfig.model_validate({"pools": [{"name": "short", "node_group": "pool_short"}]})
    pool = config.pools[0]
    bundles = llm_config(config.model, pool, config.router).get_engine_config().placement_bundles
    # Serve schedules the replica actor into bundle 0 and the engine into the replica's group.
    assert bundles == [{"CPU": config.model.engine_cpus, "pool_short": NODE_GROUP_SHARE}]


def test_unpinned_pools_ask_for_no_custom_resource():
    config = StackConfig.model_validate(_args(_serve(REPO / "ray_config.yaml")))
    for pool in config.pools:
        assert pool.node_group is None
        assert engine_bundle(config.model, pool) == {"CPU": config.model.engine_cpus}


def test_gpu_engines_ask_for_their_gpu_share_beside_the_node_group():
    config = StackConfig.model_validate(_args(_serve(GPU_SERVE)))
    assert engine_bundle(config.model, config.pools[0]) == {"CPU": 1, "GPU": 0.9, "pool_default": NODE_GROUP_SHARE}


@pytest.mark.parametrize("group", ["pool short", "pool:short", ""])
def test_node_group_must_be_a_plain_resource_name(group):
    with pytest.raises(ValueError):
        PoolSpec(name="short", node_group=group)


def test_worker_resources_parse_from_the_command_line():
    assert parse_worker("pool_short,engine_node") == {"pool_short": 1.0, "engine_node": 1.0}
    assert parse_worker("pool_long=2, engine_node") == {"pool_long": 2.0, "engine_node": 1.0}


def test_kuberay_embeds_the_gpu_serve_config_verbatim():
    assert _kuberay()["spec"]["serveConfigV2"] == GPU_SERVE.read_text()


def test_gpu_serve_config_validates_and_has_the_shape_of_ray_config():
    default, gpu = _serve(REPO / "ray_config.yaml"), _serve(GPU_SERVE)
    StackConfig.model_validate(_args(gpu))
    assert gpu.keys() == default.keys()
    assert gpu["applications"][0].keys() == default["applications"][0].keys()
    default_args, gpu_args = _args(default), _args(gpu)
    assert gpu_args.keys() == default_args.keys()
    for section in ("model", "predictor", "router"):
        assert gpu_args[section].keys() == default_args[section].keys(), section
    assert [p["name"] for p in gpu_args["pools"]] == [p["name"] for p in default_args["pools"]]
    for pool, base in zip(gpu_args["pools"], default_args["pools"]):
        assert pool.keys() == base.keys() | {"node_group"}


def _kuberay_nodes() -> list[dict]:
    """Resources each KubeRay group's pods advertise (rayStartParams holds them as quoted JSON)."""
    cluster = _kuberay()["spec"]["rayClusterConfig"]
    nodes = [{HEAD_RESOURCE: 1, "GPU": 0, "min": 1}]
    for group in cluster["workerGroupSpecs"]:
        custom = json.loads(json.loads(group["rayStartParams"]["resources"]))
        gpus = float(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        nodes.append({**custom, "GPU": gpus, "min": group["minReplicas"]})
    return nodes


def _launcher_nodes() -> list[dict]:
    launcher = yaml.safe_load(LAUNCHER.read_text())
    head = launcher["head_node_type"]
    return [{**t["resources"], **({HEAD_RESOURCE: 1} if name == head else {}), "min": t.get("min_workers", 1)}
            for name, t in launcher["available_node_types"].items()]


@pytest.mark.parametrize("nodes", [_kuberay_nodes, _launcher_nodes], ids=["kuberay", "launcher"])
def test_every_placement_the_serve_config_asks_for_has_nodes(nodes):
    nodes = nodes()
    config = StackConfig.model_validate(_args(_serve(GPU_SERVE)))
    for pool in config.pools:  # a node of the pool's own group fits its engine (GPU share included)
        group = [n for n in nodes if pool.node_group in n]
        assert len(group) == 1 and group[0].get("GPU", 0) >= config.model.engine_gpus, pool.name
    predictor = config.predictor
    placement = predictor.deployment["ray_actor_options"]["resources"]
    hosts = [n for n in nodes if all(r in n for r in placement)]
    assert predictor.deployment["max_replicas_per_node"] == 1
    assert predictor.deployment["num_replicas"] == sum(n["min"] for n in hosts)  # one per engine node
    assert all(n["GPU"] >= config.model.engine_gpus + predictor.gpus for n in hosts)  # shares the GPU
    router = config.router.deployment["ray_actor_options"]["resources"]
    assert [n for n in nodes if all(r in n for r in router)] == [nodes[0]]  # the head


def test_predictor_placement_reaches_its_serve_deployment(tmp_path):
    config = StackConfig.model_validate(_args(_serve(GPU_SERVE)))
    app = _build_predictor(config.predictor, {"estp": tmp_path / "head"}, "model", learner=None)
    deployment = app._bound_deployment
    assert deployment.num_replicas == 3 and deployment._replica_config.max_replicas_per_node == 1
    assert deployment.ray_actor_options["resources"] == {"engine_node": 0.001}
    assert deployment.ray_actor_options["num_gpus"] == 0.1
