import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(items):
    """Tests that start a cluster or stack of their own (marker own_cluster) run first, module by
    module, before the shared session stack exists: two stacks at once overload 2 cores / 24 GiB.
    (Run after it, the test process's Ray driver also has to move between clusters; in CI its
    replay actors were then cancelled before they started.)"""
    items.sort(key=lambda item: item.get_closest_marker("own_cluster") is None)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The default application from ray_config.yaml, served over real HTTP.

    Benchmark headers are on, so the tests can ask for any policy per request. The policy is the
    last-token head's (`last_work`, the GPU profile's) rather than the CPU default's layer-4 head:
    the queue tests need a head that tells their short and long prompts far apart, and requests
    without benchmark headers then take the work policies' default path. The queue's aging bound is
    20 s instead of 300 s, so that a test can watch a long request age past short ones; shorter, a
    short request's head start would be no longer than a loaded machine takes to carry it to the
    queue.
    """
    from tests.stack import RunningStack

    workdir = tmp_path_factory.mktemp("stack")
    overrides = {"router": {"policy": "last_work", "benchmark_headers": True, "queue": {"max_overtake_s": 20}}}
    running = RunningStack(workdir, overrides).start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300)

