"""A multi-node Ray cluster on one machine: a head and N worker raylets, for development and tests.

    python -m cluster.local start --worker pool_short,engine_node --worker pool_long,engine_node
    RAY_ADDRESS=127.0.0.1:<port> serve run ray_config.yaml     # the address `start` printed
    python -m cluster.local status
    python -m cluster.local remove-worker worker-2                # a machine failure, for tests
    python -m cluster.local stop

Each node is a real `ray start` raylet with its own logical CPUs, its own custom resources (the
node groups that pools are pinned to) and its own temp dir. The temp dir is what tells this
cluster's processes apart from any other Ray on the machine: `stop` and `remove-worker` kill
exactly the processes whose command line names it, and everything they spawned (vLLM engine
processes too), so `ray stop` (which kills every Ray process of the user) is never needed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

DEFAULT_ROOT = Path(os.environ.get("LENGTHSERVE_CLUSTER_DIR", "/tmp/lengthserve-cluster"))
# Small object stores: all nodes share one machine's memory and /dev/shm.
OBJECT_STORE_BYTES = 200 * 1024 * 1024
RAY = str(Path(sys.executable).with_name("ray"))
# Ray 2.60 turns token authentication on for a new head whenever ~/.ray/auth_token exists, while
# clients that name an address (`ray start --address`, `RAY_ADDRESS=... serve run`) only send the
# token under RAY_AUTH_MODE=token; so every node of this one-machine development cluster runs in one
# explicit mode, the one plain clients use.
AUTH_MODE = "disabled"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class NodeSpec:
    name: str
    num_cpus: int
    resources: dict[str, float] = field(default_factory=dict)
    node_manager_port: int = 0  # chosen at start; how `status` finds the node in Ray's node table


@dataclass
class ClusterState:
    """What `start` wrote to <root>/cluster.json, for later `status`, `remove-worker` and `stop`."""

    root: str
    address: str = ""
    dashboard_url: str | None = None
    nodes: list[NodeSpec] = field(default_factory=list)

    @classmethod
    def load(cls, root: Path) -> "ClusterState":
        path = root / "cluster.json"
        if not path.exists():
            raise FileNotFoundError(f"no local cluster under {root} (start one with `python -m cluster.local start`)")
        raw = json.loads(path.read_text())
        return cls(**{**raw, "nodes": [NodeSpec(**n) for n in raw["nodes"]]})

    def save(self) -> None:
        (Path(self.root) / "cluster.json").write_text(json.dumps(asdict(self), indent=2))

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r}; this cluster has {[n.name for n in self.nodes]}")


def parse_worker(text: str) -> dict[str, float]:
    """'pool_short,engine_node' or 'pool_short=1,engine_node=2' -> {'pool_short': 1.0, ...}."""
    resources = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, amount = item.partition("=")
        resources[name] = float(amount or 1)
    return resources


def _ray_start(root: Path, node: NodeSpec, extra: list[str]) -> None:
    node_dir = root / node.name
    node_dir.mkdir(parents=True, exist_ok=True)
    node.node_manager_port = _free_port()
    command = [
        RAY, "start", "--node-ip-address", "127.0.0.1", "--temp-dir", str(node_dir),
        "--num-cpus", str(node.num_cpus), "--num-gpus", "0", "--resources", json.dumps(node.resources),
        "--object-store-memory", str(OBJECT_STORE_BYTES), "--node-manager-port", str(node.node_manager_port),
        # Ray's fixed default ports (52365, 8265, 10001, ...) and worker port range (10002-19999)
        # would collide between the nodes of one host; 0 lets every worker take a free port.
        "--dashboard-agent-listen-port", str(_free_port()), "--metrics-export-port", str(_free_port()),
        "--min-worker-port", "0", "--max-worker-port", "0",
        "--disable-usage-stats", *extra,
    ]
    log = node_dir / "ray_start.log"
    with open(log, "w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "RAY_AUTH_MODE": AUTH_MODE})
    if result.returncode != 0:
        raise RuntimeError(f"`ray start` for {node.name} failed; see {log}:\n{log.read_text()[-3000:]}")


def node_processes(root: Path, name: str) -> list[psutil.Process]:
    """The node's Ray processes (their command lines name its temp dir) and all their descendants."""
    node_dir = str(root / name)
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        if any(arg == node_dir or arg.endswith("=" + node_dir) or node_dir + os.sep in arg
               for arg in proc.info["cmdline"] or ()):
            found[proc.pid] = proc
    for proc in list(found.values()):
        try:
            found.update({child.pid: child for child in proc.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    found.pop(os.getpid(), None)
    return list(found.values())


def _kill(processes: list[psutil.Process], graceful_s: float) -> None:
    if graceful_s > 0:
        for proc in processes:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, processes = psutil.wait_procs(processes, timeout=graceful_s)
    for proc in processes:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)


def alive_nodes(address: str) -> dict[int, dict]:
    """Ray's view: alive nodes by node-manager port (with NodeID and Resources)."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    try:
        return {n["NodeManagerPort"]: n for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()


def wait_until_alive(state: ClusterState, timeout_s: float = 120) -> None:
    wanted = {node.node_manager_port for node in state.nodes}
    deadline = time.time() + timeout_s
    while not wanted <= set(alive := alive_nodes(state.address)):
        if time.time() > deadline:
            raise TimeoutError(f"nodes not alive after {timeout_s:.0f}s: {sorted(wanted - set(alive))}")
        time.sleep(1)


def start(root: Path, head_cpus: int, head_resources: dict[str, float], workers: list[dict[str, float]],
          worker_cpus: int, dashboard: bool = True) -> ClusterState:
    if (root / "cluster.json").exists():
        raise RuntimeError(f"a local cluster is already recorded under {root}; stop it first")
    root.mkdir(parents=True, exist_ok=True)
    state = ClusterState(root=str(root))
    head = NodeSpec("head", head_cpus, head_resources)
    gcs_port = _free_port()
    dashboard_flags = ["--include-dashboard", "false"]
    if dashboard:
        dashboard_port = _free_port()
        dashboard_flags = ["--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                           "--dashboard-port", str(dashboard_port)]
        state.dashboard_url = f"http://127.0.0.1:{dashboard_port}"
    state.address = f"127.0.0.1:{gcs_port}"
    state.nodes.append(head)
    state.save()  # before starting anything: `stop` must find whatever did start
    try:
        _ray_start(root, head, ["--head", "--port", str(gcs_port), "--ray-client-server-port",
                                str(_free_port()), *dashboard_flags])
        state.save()
        for i, resources in enumerate(workers, 1):
            add_worker(state, NodeSpec(f"worker-{i}", worker_cpus, resources))
        wait_until_alive(state)
    except BaseException:
        stop(root)
        raise
    return state


def add_worker(state: ClusterState, node: NodeSpec) -> None:
    """Join one more raylet to the cluster (a replacement node, say, like an autoscaler's)."""
    if any(n.name == node.name for n in state.nodes):
        raise ValueError(f"node {node.name!r} exists already")
    state.nodes.append(node)
    state.save()
    _ray_start(Path(state.root), node, ["--address", state.address])
    state.save()


def remove_worker(state: ClusterState, name: str) -> int:
    """Kill a worker node's raylet and everything on it at once (SIGKILL): a machine failing.

    Returns how many processes were killed. The head's GCS marks the node dead after its health
    checks fail, and Ray Serve then replaces the replicas that ran there.
    """
    if name == "head":
        raise ValueError("the head cannot be removed; stop the cluster instead")
    state.node(name)
    processes = node_processes(Path(state.root), name)
    _kill(processes, graceful_s=0)
    state.nodes = [n for n in state.nodes if n.name != name]
    state.save()
    return len(processes)


def stop(root: Path) -> int:
    """Workers first, then the head; SIGTERM, then SIGKILL what is left. Returns processes ended."""
    names = sorted((p.name for p in root.iterdir() if p.is_dir()), key=lambda n: n == "head") if root.exists() else []
    ended = 0
    for name in names:
        processes = node_processes(root, name)
        _kill(processes, graceful_s=10)
        ended += len(processes)
    (root / "cluster.json").unlink(missing_ok=True)
    return ended


def status(state: ClusterState) -> list[dict]:
    alive = alive_nodes(state.address)
    rows = []
    for node in state.nodes:
        info = alive.get(node.node_manager_port)
        rows.append({"name": node.name, "alive": info is not None, "node_id": info and info["NodeID"],
                     "resources": node.resources, "num_cpus": node.num_cpus})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.local", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="state and temp dirs of the nodes")
    sub = parser.add_subparsers(dest="command", required=True)
    start_p = sub.add_parser("start", help="start a head and workers; print the address")
    start_p.add_argument("--head-cpus", type=int, default=2, help="logical CPUs of the head (router, proxy)")
    start_p.add_argument("--head-resources", type=parse_worker, default={},
                         help="custom resources of the head, e.g. pool_short,engine_node")
    start_p.add_argument("--worker", action="append", type=parse_worker, dest="workers",
                         help="one worker node with these custom resources (repeat per node), "
                         "e.g. --worker pool_short,engine_node --worker pool_long,engine_node")
    start_p.add_argument("--worker-cpus", type=int, default=2, help="logical CPUs of each worker")
    start_p.add_argument("--no-dashboard", action="store_true", help="lighter; `serve deploy` needs it")
    sub.add_parser("status", help="nodes and whether Ray sees them alive")
    remove_p = sub.add_parser("remove-worker", help="kill one worker node at once (failure test)")
    remove_p.add_argument("name")
    add_p = sub.add_parser("add-worker", help="join one more worker node")
    add_p.add_argument("name")
    add_p.add_argument("--resources", type=parse_worker, default={})
    add_p.add_argument("--cpus", type=int, default=2)
    sub.add_parser("stop", help="end every process of this cluster")
    args = parser.parse_args(argv)

    if args.command == "start":
        workers = args.workers or [parse_worker("pool_short,engine_node"), parse_worker("pool_long,engine_node")]
        state = start(args.root, args.head_cpus, args.head_resources, workers, args.worker_cpus,
                      dashboard=not args.no_dashboard)
        print(f"cluster up: {len(state.nodes)} nodes")
        print(f"  RAY_ADDRESS={state.address} serve run ray_config.yaml")
        if state.dashboard_url:
            print(f"  serve deploy ray_config.yaml --address {state.dashboard_url}")
    elif args.command == "status":
        for row in status(ClusterState.load(args.root)):
            print(json.dumps(row))
    elif args.command == "remove-worker":
        print(f"killed {remove_worker(ClusterState.load(args.root), args.name)} processes of {args.name}")
    elif args.command == "add-worker":
        state = ClusterState.load(args.root)
        add_worker(state, NodeSpec(args.name, args.cpus, args.resources))
        wait_until_alive(state)
        print(f"{args.name} joined {state.address}")
    else:
        print(f"stopped: {stop(args.root)} processes ended")


if __name__ == "__main__":
    main()
