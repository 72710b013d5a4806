"""Start the real application from ray_config.yaml, for the tests and for benchmarks.

The YAML is copied with only the HTTP port changed (so a developer's own server on 8000 is left
alone) and started with `serve run`, exactly as a user would. Overrides of `args` (more pools,
benchmark headers) are merged into the copy the same way.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import yaml

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("STACK_START_TIMEOUT_S", 900))
STOP_TIMEOUT_S = 35  # Serve's drain of the router and the pools and Ray's stop take about 24 s here
ENGINES_GONE_S = 10  # the engines end within seconds of their replica (docs/serving.md)
BENCHMARK_KEY_ENV = "LENGTHSERVE_BENCHMARK_KEY"  # the key a benchmark client sends (X-Benchmark-Key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def merge(base: dict, override: dict) -> dict:
    """`override` over `base`, nested dicts key by key (how a test or a scenario changes ray_config's args)."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _ctrl_c_stops() -> None:
    """In the child before `serve run` starts: Ctrl-C stops it, as in a terminal. A process started
    in the background of a non-interactive shell (nohup ... &, a CI step) has SIGINT ignored, and an
    ignored signal stays ignored across exec: `stop` would then wait its timeout and SIGKILL."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class RunningStack:
    def __init__(self, workdir: Path, args_override: dict | None = None, ray_address: str = "local",
                 api_key: str | None = None, application: dict | None = None):
        """`api_key`: serve with API keys on (router.api.auth), this one the only key; `application`:
        serve this application (a Serve config's entry, e.g. Ray Serve LLM's own app) instead of
        ray_config.yaml's, with ray_config's HTTP options."""
        config = yaml.safe_load((REPO / "ray_config.yaml").read_text())
        self.port = free_port()
        config["http_options"]["port"] = self.port
        if application is not None:
            config["applications"] = [application]
        app = config["applications"][0]
        if application is None:
            app["args"] = merge(app["args"], args_override or {})
            self.model = app["args"]["model"]["id"]
        else:
            self.model = app["args"]["llm_configs"][0]["model_loading_config"]["model_id"]
        # The router accepts benchmark headers only with a key of its own (router.api.auth): a fresh
        # one per stack, in the stack's environment (so its replay actors have it) and in ours.
        self.benchmark_key = None
        if application is None and app["args"].get("router", {}).get("benchmark_headers"):
            self.benchmark_key = os.environ.get(BENCHMARK_KEY_ENV) or secrets.token_urlsafe(24)
            os.environ[BENCHMARK_KEY_ENV] = self.benchmark_key
        self.api_key = api_key
        self.config_path = workdir / "ray_config.test.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "serve_run.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None
        self._ray_address = ray_address

    def __enter__(self) -> "RunningStack":
        return self.start()

    def __exit__(self, *_) -> None:
        self.stop()

    def start(self) -> "RunningStack":
        serve_bin = Path(sys.executable).with_name("serve")
        log = open(self.log_path, "w")
        # RAY_ADDRESS=local by default: always a cluster of its own, never a developer's running one
        # (whose app of the same name the test would otherwise replace); or a cluster named on purpose.
        self._proc = subprocess.Popen(
            [str(serve_bin), "run", str(self.config_path)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_ctrl_c_stops,
            env={**os.environ, "RAY_ADDRESS": self._ray_address,
                 **({"LENGTHSERVE_BENCHMARK_KEYS": self.benchmark_key} if self.benchmark_key else {}),
                 **({"LENGTHSERVE_API_KEYS": self.api_key} if self.api_key else {})},
        )
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"serve run exited early; see {self.log_path}:\n{self.tail()}")
            if self._answers():
                return self
            time.sleep(3)
        self.stop()
        raise TimeoutError(f"stack not ready after {START_TIMEOUT_S:.0f}s; see {self.log_path}")

    @property
    def client_headers(self) -> dict[str, str]:
        """What a client of this stack sends: its API key, and the key benchmark headers need."""
        return {**({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}),
                **({"X-Benchmark-Key": self.benchmark_key} if self.benchmark_key else {})}

    def _answers(self) -> bool:
        try:
            r = httpx.post(
                f"{self.base_url}/v1/completions",
                json={"model": self.model, "prompt": "Hi", "max_tokens": 1}, timeout=30, headers=self.client_headers,
            )
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def pid(self) -> int:
        """`serve run`'s process: the root of the stack's process tree (Ray, replicas, engines)."""
        return self._proc.pid

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        """Ctrl-C, as a user stops it: Serve drains, then Ray stops (about 24 s here); SIGKILL past
        STOP_TIMEOUT_S. The stack ends its own engines (deployments.engine_lifetime); a vLLM process
        that outlives it is a regression of that, logged as one and then killed, so that the next
        stack on this machine is not starved of memory by it."""
        if not self._proc or self._proc.poll() is not None:
            return
        os.killpg(self._proc.pid, signal.SIGINT)
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("serve run did not stop within %d s of Ctrl-C: killed", STOP_TIMEOUT_S)
            os.killpg(self._proc.pid, signal.SIGKILL)
        deadline = time.time() + ENGINES_GONE_S
        while (left := vllm_processes()) and time.time() < deadline:
            time.sleep(1)
        if left:
            log.error("vLLM processes outlived the stack: %s; killing them", [p.pid for p in left])
            for p in left:
                p.kill()


def vllm_processes() -> list[psutil.Process]:
    """vLLM's engine processes on this machine (it titles them `VLLM::EngineCore`, `VLLM::Worker`)."""
    found = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        title = p.info["name"] or ""
        if (title.startswith("VLLM::") or (p.info["cmdline"] or [""])[0].startswith("VLLM::")) and \
                p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found
