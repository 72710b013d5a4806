"""The replica router and the pool client inside real Ray Serve, with calls fanned out from one request.

Ray gives every handle call made while serving one request that request's internal id, and keys
its routing and completion bookkeeping by it. A rollout makes many pool calls from one request;
with a shared id Ray's completion hook names the wrong sample and a replica found for one pending
call can be handed to another. Here an ingress deployment fans calls out from inside one request,
through the real pool client, to a small streaming deployment that the stack's LedgerRequestRouter
routes (no vLLM: the replicas answer at once with who they are and which id they ran under).
"""

import asyncio

import pytest
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

pytestmark = [pytest.mark.own_cluster]

POOL = "ids-test"


@serve.deployment(num_replicas=2, max_ongoing_requests=2, ray_actor_options={"num_cpus": 0},
                  request_router_config=RequestRouterConfig(
                      request_router_class="router.serving.replica_router:LedgerRequestRouter",
                      request_router_kwargs={"pool": POOL}))
class Echo:
    """Streams, as vLLM's LLMServer does, SSE chunks naming its replica and the call's internal id."""

    async def chat(self, body, raw=None):
        import json

        from ray.serve import context

        me = serve.get_replica_context().replica_id.unique_id
        internal = context._get_serve_request_context()._internal_request_id
        for _ in range(body.max_tokens):
            await asyncio.sleep(0.02)
            delta = {"choices": [{"index": 0, "delta": {"content": f"{me}|{internal};"}, "finish_reason": None}]}
            yield [f"data: {json.dumps(delta, separators=(',', ':'))}\n\n"]
        usage = {"choices": [], "usage": {"completion_tokens": body.max_tokens}}
        yield [f"data: {json.dumps(usage, separators=(',', ':'))}\n\ndata: [DONE]\n\n"]


@serve.deployment(ray_actor_options={"num_cpus": 0})
class FanOut:
    def __init__(self, pool):
        from router.serving.pool_client import PoolClient
        from router.serving.replica_ledger import ledger

        self.client = PoolClient(POOL, pool, ledger(POOL))

    async def __call__(self, calls: list[dict]) -> dict:
        """Each call: {"tokens", "pin" (a replica index or None), "delay_s"}; all from this one request."""
        from ray.serve import context
        from ray.serve.llm.openai_api_models import ChatCompletionRequest

        from router.scheduling.request import Request
        from router.serving.pool_client import Output

        replicas = sorted(self.client.ledger.live_replicas())
        parent = context._get_serve_request_context()._internal_request_id

        async def one(i: int, call: dict) -> dict:
            await asyncio.sleep(call.get("delay_s", 0.0))
            pin = call.get("pin")
            request = Request(f"call-{i}-{parent}", "test", pinned=None if pin is None else replicas[pin])
            body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=call["tokens"], stream=True, stream_options={"include_usage": True})
            answer = await self.client.open(request, "chat", body, lambda r: None)
            output = Output()
            await answer.collect(output)
            ran_on, ran_as = output.text.split(";")[0].split("|")
            return {"id": request.id, "pinned": request.pinned, "ran_on": ran_on, "ran_as": ran_as,
                    "replica": request.replica}

        results = await asyncio.gather(*(one(i, c) for i, c in enumerate(calls)))
        return {"parent": parent, "results": results,
                "left_on_ledger": sum(load.requests for load in self.client.ledger.loads())}


@pytest.fixture(scope="module")
def fan_out():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    handle = serve.run(FanOut.bind(Echo.bind()), name="ids", route_prefix=None)
    yield handle
    serve.shutdown()
    ray.shutdown()


def test_calls_made_inside_one_request_run_under_ids_of_their_own_and_the_ledger_ends_empty(fan_out):
    out = fan_out.remote([{"tokens": 5} for _ in range(6)]).result(timeout_s=120)
    ids = [r["ran_as"] for r in out["results"]]
    assert out["parent"] and out["parent"] not in ids  # not the request's own (shared) id
    assert ids == [r["id"] for r in out["results"]]  # each ran under the id its ledger entry has
    assert all(r["replica"] == r["ran_on"] for r in out["results"])  # the ledger knows where each ran
    assert out["left_on_ledger"] == 0


def test_pins_are_honoured_while_the_pinned_replica_has_room(fan_out):
    calls = [{"tokens": 10, "pin": i % 2} for i in range(4)]  # 2 per replica: within max_ongoing_requests
    out = fan_out.remote(calls).result(timeout_s=120)
    assert all(r["ran_on"] == r["pinned"] for r in out["results"]), out["results"]


def test_a_pin_to_a_full_replica_spills_to_another_instead_of_waiting(fan_out):
    busy = [{"tokens": 100, "pin": 0}, {"tokens": 100, "pin": 0}]  # replica 0 at its limit for ~2 s
    late = [{"tokens": 2, "pin": 0, "delay_s": 0.5}]
    out = fan_out.remote(busy + late).result(timeout_s=120)
    pinned, spilled = out["results"][0]["ran_on"], out["results"][2]["ran_on"]
    assert out["results"][1]["ran_on"] == pinned and spilled != pinned
