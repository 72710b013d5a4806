"""Stopping the stack leaves nothing behind, however `serve run` is stopped (issue 44).

Each case starts the real stack from ray_config.yaml, has it answer a few requests, leaves long
ones in flight and stops `serve run` with one signal. Within 30 s nothing of the stack runs any
more (the process tree it had, and any `VLLM::` process) and its memory is free again (available
memory back within 5% of before its start). The cases run in order on the same machine, so each
start is also the restart after the previous stop; Ctrl-C, the stop Serve drains, comes last.

The SIGTERM case runs with Ray's per-worker process-group cleanup off and first SIGKILLs a pool
replica, as an OOM killer would. Ray then ends neither that replica's engine (nothing kills a
SIGKILLed worker's children) nor, at the SIGTERM, the others (the stopping raylet SIGKILLs its
workers): only the engines' own watch on their replica can (deployments.engine_lifetime). Through
that replica's restart `/health/live` stays 200 and `/health` stays ready, counting one replica.
"""

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from tests.stack import RunningStack, vllm_processes

pytestmark = [pytest.mark.stack, pytest.mark.own_cluster]

STOP_S = 30  # the bound, from the signal to nothing left
MEMORY_SLACK = 0.05
POOL = "pool-default"
# After a SIGKILL, Ray's node agents see their raylet die at once, but first report it to the GCS,
# which died with it, and exit only when that call gives up, about 60 s later
# (ray/_private/process_watcher.py, report_raylet_error_logs). Ray's own; 0.2 GB between them.
RAY_AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _left_after(procs: list[psutil.Process], since: float) -> list[psutil.Process]:
    """What still runs of `procs` and of vLLM once STOP_S have passed since `since`, or sooner."""
    while (left := _running(procs) + vllm_processes()) and time.monotonic() - since < STOP_S:
        time.sleep(0.5)
    return left


def _answers(stack: RunningStack, n: int = 4) -> list[int]:
    def one(i: int) -> int:
        body = {"model": stack.model, "messages": [{"role": "user", "content": f"Count to {i + 3}."}], "max_tokens": 16}
        return httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=120).status_code

    with ThreadPoolExecutor(n) as burst:
        return list(burst.map(one, range(n)))


def _leave_in_flight(stack: RunningStack, n: int = 8) -> None:
    """Long completions that the stop cuts: the router and the pools have work to drain."""
    def one(i: int) -> None:
        body = {"model": stack.model, "prompt": f"Story {i}:", "max_tokens": 1000, "ignore_eos": True}
        try:
            httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=STOP_S * 4)
        except httpx.HTTPError:
            pass  # cut by the stop, as it should be

    for i in range(n):
        threading.Thread(target=one, args=(i,), daemon=True).start()
    time.sleep(3)  # the requests reach the engines


def _kill_a_pool_replica(stack: RunningStack) -> None:
    """SIGKILL one pool replica: its engine ends with it, and the health checks keep their meaning."""
    replica = next(p for p in psutil.Process(stack.pid).children(recursive=True)
                   if f"ServeReplica:lengthserve:{POOL}" in " ".join(p.cmdline()))
    engine = replica.children(recursive=True)
    start = time.monotonic()
    replica.kill()
    while _running(engine) and time.monotonic() - start < STOP_S:
        time.sleep(0.5)
    assert not _running(engine), f"the killed replica's engine outlived it: {_running(engine)}"
    while True:  # until Serve has seen the replica go (it restarts it, which takes longer than this)
        live = httpx.get(f"{stack.base_url}/health/live", timeout=10)
        ready = httpx.get(f"{stack.base_url}/health", timeout=10)
        assert live.status_code == 200 and ready.status_code == 200, (live.text, ready.text)
        if ready.json()["running_replicas"][POOL] == 1:
            break
        assert time.monotonic() - start < STOP_S, ready.json()
        time.sleep(1)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "Ctrl-C"])
def test_a_stopped_stack_leaves_nothing_running_and_its_memory_free(how, tmp_path, monkeypatch):
    assert not vllm_processes(), f"vLLM processes from before this test: {vllm_processes()}"
    before = psutil.virtual_memory().available
    if how == "SIGTERM":
        monkeypatch.setenv("RAY_process_group_cleanup_enabled", "0")
    stack = RunningStack(tmp_path).start()
    try:
        assert _answers(stack) == [200] * 4
        if how == "SIGTERM":
            _kill_a_pool_replica(stack)
        _leave_in_flight(stack)
        serve_run = psutil.Process(stack.pid)
        tree = [p for p in [serve_run, *serve_run.children(recursive=True)]
                if how != "SIGKILL" or p.name() not in RAY_AGENTS]
        assert len(vllm_processes()) >= 2
        signalled = time.monotonic()
        if how == "Ctrl-C":
            os.killpg(stack.pid, signal.SIGINT)  # what a terminal sends to the foreground process group
        else:
            serve_run.send_signal(getattr(signal, how))
        try:
            serve_run.wait(timeout=STOP_S)
        except psutil.TimeoutExpired:
            pytest.fail(f"{how}: `serve run` still running {STOP_S} s later")
        left = _left_after(tree, signalled)
        assert not left, f"{how}: still running {time.monotonic() - signalled:.0f} s later: {left}"
        while psutil.virtual_memory().available < (1 - MEMORY_SLACK) * before and time.monotonic() - signalled < STOP_S:
            time.sleep(0.5)
        after = psutil.virtual_memory().available
        assert after >= (1 - MEMORY_SLACK) * before, f"{how}: {after / 2**30:.1f} GiB available, {before / 2**30:.1f} before"
    finally:
        stack.stop()  # only if the test failed before `serve run` ended
