"""Remaining work from the predicted distribution and the per-replica ledger (no server)."""

import pytest

from predictor.head import LengthBins
from router.length_bins import expected_remaining, still_running
from router.replica_ledger import ReplicaLedger

UNIFORM = LengthBins(edges=[0, 100, 200], centres=[50, 150], max_tokens=200)


def test_remaining_length_is_conditioned_on_the_tokens_generated_so_far():
    probs = [0.5, 0.5]  # uniform on (0, 200]
    assert expected_remaining(UNIFORM, probs, 0) == pytest.approx(100)
    assert expected_remaining(UNIFORM, probs, 100) == pytest.approx(50)  # L | L > 100 is uniform on (100, 200]
    assert expected_remaining(UNIFORM, probs, 150) == pytest.approx(25)
    assert expected_remaining(UNIFORM, [1.0, 0.0], 0, cap=50) == pytest.approx(37.5)  # E[min(U(0,100), 50)]
    assert expected_remaining(UNIFORM, [1.0, 0.0], 120) == 1.0  # outlived every bin: about to end


def test_sequences_still_running_after_a_horizon():
    probs = [0.5, 0.5]
    assert still_running(UNIFORM, probs, 0, 100) == pytest.approx(0.5)
    assert still_running(UNIFORM, probs, 100, 50) == pytest.approx(0.5)
    assert still_running(UNIFORM, probs, 150, 100) == 0.0


def test_the_ledger_follows_requests_to_their_replicas_and_takes_late_predictions():
    ledger = ReplicaLedger()
    ledger.routed("a", "ray-a", "replica-1")
    ledger.routed("b", "ray-b", "replica-1")
    assert ledger.snapshot() == {"replica-1": {"requests": 2, "predicted": 0, "predicted_remaining_tokens": 0.0}}
    ledger.predicted("a", (UNIFORM, [0.5, 0.5]), None)  # a prediction that lands after dispatch
    assert ledger.snapshot()["replica-1"]["predicted_remaining_tokens"] == pytest.approx(100)
    for _ in range(100):
        ledger.streamed("a")
    assert ledger.snapshot()["replica-1"]["predicted_remaining_tokens"] == pytest.approx(50)
    ledger.completed("ray-a")
    ledger.drop("b")
    assert ledger.snapshot() == {}
    # Ray may report a stream complete before its last chunk is read: where it ran is still known
    assert ledger.replica_of("a") == "replica-1"
    ledger.drop("a")
    assert ledger.replica_of("a") is None


def test_the_replica_router_ranks_replicas_by_requests_in_flight():
    from types import SimpleNamespace

    from router.replica_router import LedgerRequestRouter

    ledger = ReplicaLedger()
    for i, replica in enumerate(["a", "a", "a", "b", "c", "c"]):
        ledger.routed(f"q{i}", f"ray-{i}", replica)
    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=u)) for u in ("a", "b", "c", "d")]
    ranked = LedgerRequestRouter._least_inflight(SimpleNamespace(_ledger=ledger), replicas)
    assert [group[0].replica_id.unique_id for group in ranked] == ["d", "b", "c", "a"]
