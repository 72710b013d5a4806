"""What a response says about its routing, and the benchmark headers a request may carry (no server)."""

import pytest

from router.api.auth import Keys
from router.api.headers import benchmark_overrides, routing_extension, routing_headers
from router.scheduling.policies import POLICIES
from router.scheduling.request import Prediction, Request
from router.serving.errors import APIError

POOLS = ["short", "medium", "long"]
KEYS = Keys(api=frozenset(), benchmark=frozenset({"k"}))


def test_routing_headers_and_extension_come_from_the_record():
    prediction = Prediction("estp", 123.4, {"p50": 100.0}, "medium", {"short": 0.2, "medium": 0.5, "long": 0.3})
    request = Request("r", "estp", arrival=10.0, decided_at=10.01234, dispatched_at=12.51234, queued=True,
                      prompt_tokens=40, prediction=prediction, estimate=prediction, pool="long", chosen_pool="medium",
                      decided_by="estp", priority=123)
    assert routing_headers(request) == {"X-Pool": "long", "X-Routing-Policy": "estp", "X-Routing-Ms": "12.3",
                                        "X-Queue-Ms": "2500.0", "X-Predicted-Tokens": "123", "X-Length-Source": "head",
                                        "X-Length-Bin": "medium", "X-Spilled-From": "medium"}
    ext = routing_extension(request)
    assert ext["length_prediction"]["prompt_tokens"] == 40 and ext["length_prediction"]["bin"] == "medium"
    assert ext["length_prediction"]["source"] == "head"
    assert ext["length_prediction"]["pool"] == "medium"
    assert ext["routing"] == {"pool": "long", "policy": "estp", "spilled_from": "medium", "fallback": None,
                              "priority": 123, "routing_ms": 12.3, "queued_ms": 2500.0}
    fallback = Request("r", "estp", arrival=1.0, decided_at=1.0, pool="short", chosen_pool="short",
                       decided_by="input_length", fallback="timeout", priority=100)
    assert routing_headers(fallback) == {"X-Pool": "short", "X-Routing-Policy": "input_length", "X-Routing-Ms": "0.0",
                                         "X-Queue-Ms": "0.0", "X-Routing-Fallback": "timeout"}
    assert routing_extension(fallback)["length_prediction"] is None


def test_a_cheap_signal_answers_in_the_same_shape_as_a_prediction():
    hint = Prediction(None, 300.0, {"p10": None, "p50": 300.0, "p90": None}, "long", None, "hint")
    request = Request("r", "last_work", arrival=1.0, decided_at=1.0, prompt_tokens=9, estimate=hint, pool="long",
                      chosen_pool="long", decided_by="last_work", priority=300)
    headers = routing_headers(request)
    assert [headers[h] for h in ("X-Predicted-Tokens", "X-Length-Source", "X-Length-Bin")] == ["300", "hint", "long"]
    assert routing_extension(request)["length_prediction"] == {
        "source": "hint", "expected_tokens": 300.0, "quantiles": {"p10": None, "p50": 300.0, "p90": None},
        "pool": "long", "bin": "long", "pool_probabilities": None, "prompt_tokens": 9}


def _headers(**values) -> dict:
    return {f"x-{k.replace('_', '-')}": v for k, v in values.items()}


def test_benchmark_headers_pick_policy_told_length_and_pool():
    got = benchmark_overrides(_headers(routing_policy="egtp", true_output_tokens="42", target_pool="long",
                                       fixed_output_tokens="300", predictor_budget="never", benchmark_key="k"),
                              True, POLICIES, POOLS, KEYS)
    assert (got.policy, got.told_tokens, got.pool, got.fixed_tokens, got.budget) == ("egtp", 42, "long", 300, "never")
    assert benchmark_overrides({}, True, POLICIES, POOLS, KEYS) == benchmark_overrides({}, False, POLICIES, POOLS, KEYS)


@pytest.mark.parametrize("enabled,headers,fragment", [
    (True, {"routing_policy": "fastest"}, "Unknown routing policy"),
    (True, {"true_output_tokens": "-3"}, "non-negative integer"),
    (True, {"target_pool": "huge"}, "Unknown pool"),
    (True, {"fixed_output_tokens": "0"}, "positive integer"),
    (True, {"fixed_output_tokens": "ten"}, "positive integer"),
    (False, {"fixed_output_tokens": "10"}, "benchmark headers are off"),
    (True, {"predictor_budget": "sometimes"}, "must be one of"),
    (False, {"predictor_budget": "always"}, "benchmark headers are off"),
    (False, {"routing_policy": "oracle"}, "benchmark headers are off"),
    (False, {"true_output_tokens": "7"}, "benchmark headers are off"),
])
def test_bad_or_unexpected_benchmark_headers_are_400(enabled, headers, fragment):
    with pytest.raises(APIError, match=fragment) as err:
        benchmark_overrides(_headers(**headers, benchmark_key="k"), enabled, POLICIES, POOLS, KEYS)
    assert err.value.status == 400


def test_benchmark_headers_need_their_own_key():
    """Without it any client could claim its request is 0 tokens long and jump the queue."""
    for key in (None, "wrong"):
        headers = _headers(routing_policy="oracle", true_output_tokens="0", **({"benchmark_key": key} if key else {}))
        with pytest.raises(APIError) as err:
            benchmark_overrides(headers, True, POLICIES, POOLS, KEYS)
        assert err.value.status == 401
