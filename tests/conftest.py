import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_session_stacks = []  # the shared stack, once started


def pytest_collection_modifyitems(items):
    """Tests that start a cluster of their own (marker own_cluster) run after every other test:
    by then the shared session stack has served all its tests and can be stopped for them."""
    items.sort(key=lambda item: item.get_closest_marker("own_cluster") is not None)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The default application from ray_config.yaml, served over real HTTP.

    Benchmark headers are on, so the routing and replay tests can ask for any policy per
    request; requests without them take exactly the default path (policy estp).
    """
    from tests.stack import RunningStack

    running = RunningStack(tmp_path_factory.mktemp("stack"), {"router": {"benchmark_headers": True}}).start()
    _session_stacks.append(running)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def session_stack_stopped():
    """Two stacks at once do not fit 2 cores and 24 GiB: a test with a cluster of its own stops the
    shared one first (it runs last, see pytest_collection_modifyitems)."""
    for running in _session_stacks:
        running.stop()
