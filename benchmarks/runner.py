"""Runs a scenario's sides on the real stack, interleaved repeat by repeat, resumable.

Repeat k runs every side once, the sides of one application back to back; the stock app goes
first in even repeats and this stack first in odd ones, so a slow spell of the machine (they drift
within a session) hits both alike and each application starts once per repeat; the sides on this
stack swap places every second repeat. Every run probes the machine before and after
(benchmarks.replay.probe) and leaves its per-request records under
benchmarks/results/runs/<scenario>/<side>__r<k>.jsonl, which the report and the simulator's
validation read; a run whose file exists is not run again, and the scenario's results file is
rebuilt after every run, so a session cut off keeps all it finished.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from tqdm import tqdm

from benchmarks import report, rollouts, workloads
from benchmarks.apps import RUN_TIMEOUT_S, App, request_log, stack_app, stock_app
from benchmarks.replay.actors import START_LEAD_S, connect, spawn_actors
from benchmarks.replay.probe import measure
from benchmarks.replay.runs import execute, run_path
from benchmarks.replay.stack import RunningStack
from benchmarks.scenarios import Scenario, Side

ACTORS = 2


def order(scenario: Scenario, repeat: int) -> list[Side]:
    """A repeat's sides, grouped by application, the stock app first in even repeats.

    The sides that share this stack swap places every second repeat: the machine drifts within a
    session, and a side that always ran second on a warm stack would carry that drift as its own.
    """
    stock_first = repeat % 2 == 0
    sides = scenario.sides if repeat // 2 % 2 == 0 else scenario.sides[::-1]
    return sorted(sides, key=lambda s: (s.app == "stock") != stock_first)


def pending(scenario: Scenario) -> list[tuple[int, Side]]:
    return [(k, side) for k in range(scenario.repeats) for side in order(scenario, k)
            if k < scenario.repeats_of(side) and not run_path(f"{scenario.name}/{side.name}/r{k}").exists()]


class Session:
    """The application the current side runs on, started when a side needs another one."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.app: App | None = None
        self.stack: RunningStack | None = None
        self.actors: list = []

    def use(self, app: App) -> RunningStack:
        if app != self.app:
            self.close()
            self.stack = RunningStack(self.workdir, app.overrides, application=app.application).start()
            self.app = app
            os.environ["RAY_ADDRESS"] = "auto"  # the cluster the stack's `serve run` started
            connect()
            self.actors = spawn_actors(self.stack.base_url, ACTORS, RUN_TIMEOUT_S)
        return self.stack

    def close(self) -> None:
        if self.stack is not None:
            import ray

            ray.shutdown()
            self.stack.stop()
        self.app = self.stack = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *_) -> None:
        self.close()


def run(scenario: Scenario, repeats: int | None = None) -> None:
    """Every pending run of `scenario` (its table's repeats, or `repeats`), then its results file."""
    if repeats is not None:
        scenario = dataclasses.replace(scenario, repeats=repeats)
    todo = pending(scenario)
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp)) as session:
        requests = None
        for k, side in tqdm(todo, desc=scenario.name, unit="run"):
            app = stock_app() if side.app == "stock" else stack_app(scenario, session.workdir)
            stack = session.use(app)
            name = f"{scenario.name}/{side.name}/r{k}"
            if scenario.kind == "rollout":
                rollouts.execute(name, stack, session.actors, scenario, side)
            else:
                if requests is None:  # one trace for every side of this session (a load's is probed once)
                    requests = workloads.trace(scenario.workload, scenario.name, lambda: _probe(session, scenario))
                execute(name, stack.base_url, session.actors, workloads.for_side(requests, side, scenario.workload.seed),
                        side.policy, None if side.app == "stock" else request_log(session.workdir), timeout_s=RUN_TIMEOUT_S,
                        label=side.name, progress=True)
            report.write(scenario.report)
    report.write(scenario.report)


def _probe(session: Session, scenario: Scenario) -> float:
    return measure(session.stack.base_url, session.actors, f"{scenario.name}/capacity", START_LEAD_S)["step_s"]
