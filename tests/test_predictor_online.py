"""Learning from served traffic: censored labels in the loss and fit loop, the stratified
reservoir, the online learner (install rule, versions, persistence, atomic publication) and the
refit scheduler. Small synthetic inputs, one torch thread, no model and no Ray."""

import pytest
import torch

from predictor.checkpoint import BaseModelMismatchError
from predictor.fit import FitConfig, fit_head, scorable
from predictor.head import LengthBins
from predictor.losses import LossConfig, length_loss
from predictor.targets import build_targets

torch.set_num_threads(1)

SPIKY = LengthBins(edges=[0, 10, 20, 1023, 1024], centres=[5, 15, 500, 1024], max_tokens=1024)


# --- censored labels ------------------------------------------------------------------------------

def test_survival_counts_the_cut_bin_by_its_uniform_share_and_the_cap_as_the_last_bin():
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    s = lambda c: SPIKY.survival(p, torch.tensor([float(c)])).item()  # noqa: E731
    assert s(15) == pytest.approx(0.2 * (20 - 14) / 10 + 0.3 + 0.4)  # P(L >= 15) = mass above 14
    assert s(0) == pytest.approx(1.0) and s(1) == pytest.approx(1.0)
    assert s(1024) == pytest.approx(0.4) and s(5000) == pytest.approx(0.4)  # at and beyond the cap: the last bin
    assert s(1023) == pytest.approx(0.3 / 1003 + 0.4)  # continuous into the cap with a spike bin
    wide = LengthBins(edges=[0, 100, 1024], centres=[50, 600], max_tokens=1024)
    q = torch.tensor([[0.25, 0.75]])
    assert wide.survival(q, torch.tensor([1024.0])).item() == pytest.approx(0.75)  # where an exact 1024 would go


def test_a_censored_row_costs_minus_log_survival_and_an_exact_row_the_configured_loss():
    logits = torch.tensor([[0.3, -1.0, 0.5, 0.2], [1.0, 0.0, -0.5, 0.1], [0.0, 0.0, 0.0, 2.0]])
    lengths = torch.tensor([15.0, 300.0, 1024.0])
    censored = torch.tensor([True, False, True])
    probs = logits.softmax(-1)
    nll = -SPIKY.survival(probs, lengths).log()
    alone = length_loss(logits[:1], lengths[:1], SPIKY, censored=censored[:1])
    assert alone.item() == pytest.approx(nll[0].item(), rel=1e-5)
    assert length_loss(logits[2:], lengths[2:], SPIKY, censored=censored[2:]).item() == pytest.approx(
        -probs[2, -1].log().item(), rel=1e-5)
    exact = length_loss(logits[1:2], lengths[1:2], SPIKY)
    mixed = length_loss(logits, lengths, SPIKY, censored=censored)
    assert mixed.item() == pytest.approx((nll[0] + nll[2] + exact).item() / 3, rel=1e-5)
    no_flags = length_loss(logits, lengths, SPIKY)
    assert torch.equal(length_loss(logits, lengths, SPIKY, censored=torch.zeros(3, dtype=torch.bool)), no_flags)


def _cut_at(c: int, n: int = 160, seed: int = 0):
    """Short prompts (dim 0 = 0) answer in ~100 tokens, long ones (dim 0 = 1) in ~700, but every
    long answer was stopped at c tokens, as a client's max_tokens would."""
    g = torch.Generator().manual_seed(seed)
    long = torch.arange(n) % 2 == 1
    x = torch.cat([long.float()[:, None], torch.randn(n, 3, generator=g) * 0.1], dim=1)
    natural = torch.where(long, 700, 100) + torch.randint(-40, 40, (n,), generator=g)
    observed = torch.where(long, torch.tensor(c), natural)
    return x, [[int(v)] for v in observed], [[bool(v)] for v in long]


def test_a_censored_label_moves_the_predicted_mass_above_its_cut():
    bins = LengthBins.log_spaced(12, 1024, 16.0)
    x, y, cens = _cut_at(300)
    xv, yv, cv = _cut_at(300, 60, 1)
    config = FitConfig(epochs=60, patience=60, batch_size=32, calibrate="none", hidden=16)
    censored_head, _ = fit_head(x, y, xv, yv, bins, LossConfig(), config, cens, cv)
    naive_head, _ = fit_head(x, y, xv, yv, bins, LossConfig(), config)  # the cut taken as the length
    long_prompt = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    with torch.no_grad():
        above = [bins.survival(h(long_prompt).softmax(-1), torch.tensor([301.0])).item()
                 for h in (censored_head, naive_head)]
        short = bins.expected(censored_head(torch.zeros(1, 4)).softmax(-1)).item()
    assert above[0] > 0.9 and above[0] > above[1] + 0.3
    assert short < 200  # exact rows still learn as before


def test_exact_only_training_is_unchanged_by_all_false_flags():
    x, y, _ = _cut_at(300, 60)
    xv, yv, _ = _cut_at(300, 20, 1)
    bins = LengthBins.from_lengths([v for s in y for v in s], k=6)
    config = FitConfig(epochs=8, patience=4, members=2)
    plain, m1 = fit_head(x, y, xv, yv, bins, LossConfig(), config)
    flagged, m2 = fit_head(x, y, xv, yv, bins, LossConfig(), config,
                           [[False] for _ in y], [[False] for _ in yv])
    assert m1 == m2
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), flagged.state_dict().values()))
    assert torch.equal(plain.cdf_map, flagged.cdf_map)


def test_only_rows_with_a_known_length_are_scored():
    lengths = torch.tensor([50.0, 300.0, 1024.0, 2048.0])
    keep, y = scorable(lengths, torch.tensor([False, True, True, True]), SPIKY)
    assert keep.tolist() == [True, False, True, True] and y.tolist() == [50, 300, 1024, 1024]


def test_per_prompt_targets_refuse_censored_samples():
    with pytest.raises(ValueError):
        build_targets([[10, 20]], "median", SPIKY, [[False, True]])
    assert build_targets([[10, 20]], "samples", SPIKY, [[False, True]]).censored.tolist() == [False, True]
    assert build_targets([[10, 20]], "median", SPIKY, [[False, False]]).lengths.tolist() == [15.0]


# --- the reservoir --------------------------------------------------------------------------------

from predictor.online.reservoir import Observation, StratifiedReservoir, stratum  # noqa: E402


def obs(i: int, prompt_tokens: int = 100, tokens: int = 200, censored: bool = False) -> Observation:
    return Observation(f"r{i}", torch.full((4,), float(i)), tokens, censored, prompt_tokens)


def test_strata_are_log_buckets_of_prompt_and_output_with_censored_apart():
    assert stratum(obs(0, 64, 32)) == "p0/o0" and stratum(obs(0, 65, 33)) == "p1/o1"
    assert stratum(obs(0, 100_000, 5000)) == "p7/o6" and stratum(obs(0, 3000, 5, censored=True)) == "p6/cut"


def test_the_bound_holds_and_a_burst_of_one_stratum_leaves_the_others_intact():
    kinds = [(50, 20), (50, 300), (500, 20), (500, 300), (500, 700, True)]
    r = StratifiedReservoir(capacity=100, seed=1)
    for i in range(100):
        r.add(obs(i, *kinds[i % 5]))
    before = r.counts()
    assert len(r) == 100 and set(before.values()) == {20}
    for i in range(100, 1100):  # a burst of one kind of traffic
        evicted = r.add(obs(i, 50, 300))
        assert len(r) == 100 and stratum(evicted) == "p0/o4"
    assert r.counts() == before
    kept = [o.key for o in r.observations() if stratum(o) == "p0/o4"]
    assert len(kept) == 20 and any(int(k[1:]) >= 100 for k in kept)  # the burst is sampled, not ignored


def test_eviction_is_seeded_and_a_restored_reservoir_continues_identically():
    def run(seed, n):
        r = StratifiedReservoir(30, seed)
        for i in range(n):
            r.add(obs(i, 50 + 37 * (i % 7), 10 + 97 * (i % 5)))
        return r

    a, b = run(3, 200), run(3, 200)
    assert [o.key for o in a.observations()] == [o.key for o in b.observations()]
    assert [o.key for o in run(4, 200).observations()] != [o.key for o in a.observations()]
    restored = StratifiedReservoir.restore(30, 3, a.offered, a.observations())
    for i in range(200, 260):
        a.add(obs(i, 50 + 37 * (i % 7), 10 + 97 * (i % 5)))
        restored.add(obs(i, 50 + 37 * (i % 7), 10 + 97 * (i % 5)))
    assert [o.key for o in a.observations()] == [o.key for o in restored.observations()]


# --- the learner ----------------------------------------------------------------------------------

import threading  # noqa: E402
import time  # noqa: E402

from predictor.checkpoint import CheckpointMeta  # noqa: E402
from predictor.head import LengthHead  # noqa: E402
from predictor.online import OnlineLearner, RefitPolicy, online_bins, published_version, read_published  # noqa: E402
from predictor.online.learner import is_heldout  # noqa: E402
from predictor.online.publish import POINTER, publish_head  # noqa: E402
from predictor.online.quality import concordance  # noqa: E402
from predictor.online.refit import Candidate, HeldOut  # noqa: E402
from predictor.pooling import PoolingConfig  # noqa: E402

D = 8
QUICK_FIT = FitConfig(members=1, epochs=30, patience=8, hidden=16)


def traffic(n: int, seed: int = 0, start: int = 0):
    """Requests whose length grows with the first feature; the longest are cut at the cap."""
    g = torch.Generator().manual_seed(seed)
    for i in range(start, start + n):
        x = torch.randn(D, generator=g)
        natural = int((350 + 250 * x[0] + 40 * torch.randn(1, generator=g)).clamp(5, 1500))
        yield f"req{i}", x, 50 + 13 * (i % 40), min(natural, 1024), natural >= 1024


def learner(path, **kw) -> OnlineLearner:
    return OnlineLearner(path, D, **{"model_id": "toy", "model_hash": "toyhash", "fit": QUICK_FIT, **kw})


def feed(lr: OnlineLearner, requests) -> None:
    for rid, x, p, tokens, cut in requests:
        lr.add_features(rid, x, p)
        lr.add_label(rid, tokens, cut)


def test_unmatched_features_expire_by_age_not_by_the_traffic_that_finished_meanwhile(tmp_path):
    import time

    lr = learner(tmp_path, pending_ttl_s=0.3)
    lr.add_features("long", torch.ones(D), 20)
    for i in range(40):  # many short requests come and go while the long one decodes
        lr.add_features(f"short{i}", torch.ones(D), 20)
        lr.add_label(f"short{i}", 10, False)
    lr.add_label("long", 900, False)
    assert lr.status()["samples"] == 41
    lr.add_features("abandoned", torch.ones(D), 20)  # its request never finishes
    time.sleep(0.4)
    lr.add_features("fresh", torch.ones(D), 20)
    s = lr.status()
    assert s["pending_features"] == 1 and s["expired_features"] == 1


def test_features_and_labels_join_in_any_order_and_unmatched_ones_expire_by_count(tmp_path):
    lr = learner(tmp_path, max_pending=3)
    lr.add_label("a", 100, False)
    lr.add_features("a", torch.ones(D), 20)
    lr.add_features("b", torch.ones(D), 20)
    lr.add_label("b", 1024, True)
    for i in range(5):
        lr.add_features(f"lost{i}", torch.ones(D), 20)
        lr.add_label(f"gone{i}", 10, False)
    s = lr.status()
    assert s["samples"] == 2 and s["censored_samples"] == 1 and s["pending_features"] == 3 and s["pending_labels"] == 3
    assert s["expired_features"] == 2 and s["expired_labels"] == 2
    lr.add_label("lost0", 5, False)  # expired: its features are gone
    lr.add_label("lost4", 5, False)
    assert lr.status()["samples"] == 3
    with pytest.raises(ValueError):
        lr.add_features("c", torch.ones(D + 1), 20)


def test_concordance_counts_a_censored_request_only_where_the_order_is_certain():
    tokens = torch.tensor([100.0, 200.0, 150.0, 150.0])
    censored = torch.tensor([False, False, True, True])
    # Pairs of known order: 100 < 200, 100 < cut at 150 (twice); 200 vs a cut at 150 is unknown.
    assert concordance(torch.tensor([1.0, 2.0, 3.0, 0.0]), tokens, censored) == pytest.approx(2 / 3)
    assert concordance(torch.tensor([1.0, 1.0, 3.0, 3.0]), tokens, censored) == pytest.approx(2.5 / 3)
    assert concordance(torch.zeros(2), torch.tensor([5.0, 9.0]), torch.tensor([True, True])) is None


def test_first_install_needs_the_concordance_floor_and_versions_count_up(tmp_path):
    lr = learner(tmp_path / "strict", floor=0.999)
    feed(lr, traffic(300))
    assert not lr.consider(lr.refit()) and lr.current() is None and read_published(tmp_path / "strict") is None
    lr = learner(tmp_path / "live")
    feed(lr, traffic(300))
    candidate = lr.refit()
    assert candidate.quality["concordance"] > 0.8 and candidate.quality["mae"] < 120
    assert lr.consider(candidate) and lr.current()[0] == 1
    version, head, meta = read_published(tmp_path / "live")
    assert version == 1 and meta.metrics["version"] == 1 and meta.bins == online_bins()
    assert not lr.consider(candidate)  # a draw keeps the current head
    assert lr.current()[0] == 1 and lr.status()["rejections"] == 1


def test_a_refit_worse_on_the_heldout_rows_is_not_installed(tmp_path):
    good = learner(tmp_path / "offline")
    feed(good, traffic(1500, seed=1))
    offline = good.refit()
    lr = learner(tmp_path / "online", base_head=(offline.head, offline.meta),
                 fit=FitConfig(members=1, epochs=1, hidden=16))
    assert lr.current()[0] == 0 and lr.bins == offline.meta.bins
    feed(lr, traffic(150, seed=2))
    weak = lr.refit()  # one epoch on 120 rows
    assert not lr.consider(weak)
    decision = lr.last_decision
    assert decision["candidate"]["mae_recent"] > decision["current"]["mae_recent"] and lr.current()[0] == 0
    assert not (tmp_path / "online" / POINTER).exists()


def test_a_new_learner_over_the_same_directory_resumes_reservoir_version_and_head(tmp_path):
    lr = learner(tmp_path, capacity=200)
    feed(lr, traffic(260))
    assert lr.consider(lr.refit())
    feed(lr, traffic(40, start=260))
    lr.add_features("in-flight", torch.ones(D), 10)
    lr.save()
    again = learner(tmp_path, capacity=200)
    assert [(o.key, o.tokens, o.censored, o.prompt_tokens) for o in again.reservoir.observations()] == \
        [(o.key, o.tokens, o.censored, o.prompt_tokens) for o in lr.reservoir.observations()]
    pairs = zip(again.reservoir.observations(), lr.reservoir.observations())
    assert all(torch.equal(a.vector, b.vector) for a, b in pairs)
    assert again.reservoir.offered == 300 and again.counters == lr.counters and again.quality == lr.quality
    assert again.current()[0] == lr.current()[0] == 1 and again.bins == lr.bins
    x = torch.randn(5, D)
    with torch.no_grad():
        assert torch.equal(again.current()[1](x), lr.current()[1](x))
    for learner_ in (lr, again):  # both continue the same way
        feed(learner_, traffic(30, start=300))
    assert [o.key for o in again.reservoir.observations()] == [o.key for o in lr.reservoir.observations()]
    with pytest.raises(ValueError):
        learner(tmp_path, bins=LengthBins.log_spaced(10))  # bins are fixed for the learner's life
    with pytest.raises(BaseModelMismatchError):
        learner(tmp_path, model_hash="another model")  # never serve another model's head


def test_the_serving_head_and_the_learner_share_bins(tmp_path):
    with pytest.raises(ValueError):
        learner(tmp_path, base_head=_predicting(100), bins=LengthBins.log_spaced(10))


def test_ready_to_refit_waits_for_samples_new_labels_and_time(tmp_path):
    lr = learner(tmp_path, policy=RefitPolicy(min_new_labels=50, min_interval_s=60, min_samples=100))
    feed(lr, traffic(99))
    assert not lr.ready_to_refit()
    feed(lr, traffic(1, start=99))
    assert lr.ready_to_refit()
    lr.snapshot()
    feed(lr, traffic(60, start=100))
    assert not lr.ready_to_refit() and lr.ready_to_refit(now=time.time() + 61)
    assert not RefitPolicy().due(samples=5000, new_labels=199, seconds_since_last=1e9)


def test_no_refit_is_due_before_a_held_out_request_of_known_length(tmp_path):
    """A candidate is judged on held-out rows whose length is known; a refit without one could only fail."""
    lr = learner(tmp_path, policy=RefitPolicy(min_new_labels=1, min_interval_s=0, min_samples=10))
    rows = list(traffic(40))
    held = [r for r in rows if is_heldout(r[0], lr.heldout_share)]
    train = [r for r in rows if not is_heldout(r[0], lr.heldout_share)]
    assert held and train
    feed(lr, train)
    assert not lr.ready_to_refit()  # enough samples, none held out
    feed(lr, [(rid, x, p, 3, True) for rid, x, p, _, _ in held])  # held out, but cut at 3 tokens: censored
    assert not lr.ready_to_refit()
    known = next(f"known{i}" for i in range(1000) if is_heldout(f"known{i}", lr.heldout_share))
    feed(lr, [(known, held[0][1], held[0][2], 200, False)])
    assert lr.ready_to_refit()


def _predicting(tokens: float) -> tuple[LengthHead, CheckpointMeta]:
    """A head that predicts the bin of `tokens` for every input."""
    head, meta = _constant_head(1)
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
        head.members[0][-1].bias[meta.bins.index(torch.tensor([tokens]))] = 30.0
    return head, meta


def test_heads_are_compared_on_recent_heldout_rows_when_the_traffic_shifts(tmp_path):
    from predictor.online.quality import evaluate

    old, new = _predicting(100), _predicting(900)
    decisions = {}
    for half_life in (5, None):
        lr = learner(tmp_path / str(half_life), base_head=old, heldout_share=1.0, recency_half_life=half_life)
        for i in range(70):  # 60 short requests, then the traffic turns long
            lr.add_features(f"r{i}", torch.randn(D), 30)
            lr.add_label(f"r{i}", 100 if i < 60 else 900, False)
        data = lr.snapshot()
        weight = {o.key: w for o, w in zip(lr.reservoir.observations(), data.weight.tolist())}
        assert weight["r69"] == 1 and weight["r64"] == pytest.approx(1 if half_life is None else 0.5)
        held = HeldOut(data.x, data.tokens, data.censored, data.weight)
        quality = evaluate(new[0], lr.bins, held.x, held.tokens, held.censored, held.weight)
        decisions[half_life] = lr.consider(Candidate(*new, held, quality, 0.0))
    assert decisions == {5: True, None: False}


def test_a_request_cut_at_the_cap_trains_as_exact_and_one_cut_below_it_as_censored(tmp_path):
    for cap_as_exact in (True, False):
        lr = learner(tmp_path / str(cap_as_exact), cap_as_exact=cap_as_exact)
        for i, (tokens, cut) in enumerate([(1024, True), (2048, True), (300, True), (1024, False), (3000, False)]):
            lr.add_features(f"r{i}", torch.randn(D), 30)
            lr.add_label(f"r{i}", tokens, cut)
        data = lr.snapshot()
        order = [int(o.key[1:]) for o in lr.reservoir.observations()]
        by_request = {r: (t, c) for r, t, c in zip(order, data.tokens.tolist(), data.censored.tolist())}
        # Lengths beyond the bins' reach are in the last bin: 2048 censored is "at least 1024", and
        # an exact 3,000 (a client cap above the head's) scores as 1,024, not as a 2,000-token miss.
        expected = {0: (1024, not cap_as_exact), 1: (1024, not cap_as_exact), 2: (300, True),
                    3: (1024, False), 4: (1024, False)}
        assert by_request == expected


def _constant_head(version: int) -> tuple[LengthHead, CheckpointMeta]:
    """A head whose every parameter is its version: a mix of two versions shows at once."""
    bins = online_bins()
    head = LengthHead(D, bins.k, hidden=4).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.fill_(version / 100)
    meta = CheckpointMeta(base_model_id="toy", base_model_hash="toyhash", feature_layer=-1, feature_dim=D,
                          pooling=PoolingConfig(method="last"), bins=bins, loss=LossConfig(), fit=FitConfig(hidden=4),
                          training_data_version="test", metrics={"version": float(version)})
    return head, meta


def _whole(version: int, head: LengthHead, meta: CheckpointMeta) -> bool:
    return meta.metrics["version"] == version and all(
        torch.all(p == version / 100) for p in head.parameters())


def test_readers_never_see_a_mixed_or_partial_head_while_versions_are_swapped(tmp_path):
    lr = learner(tmp_path, floor=0.0)
    rows = HeldOut(torch.randn(20, D), torch.arange(20.0) * 10 + 5, torch.zeros(20, dtype=torch.bool), torch.ones(20))
    seen, bad, stop = [], [], threading.Event()

    def in_process():
        while not stop.is_set():
            current = lr.current()
            if current:
                version, head, meta = current
                with torch.no_grad():
                    head(torch.randn(2, D))
                if not _whole(version, head, meta):
                    bad.append(("memory", version))
                seen.append(version)

    def from_files():
        while not stop.is_set():
            polled = published_version(tmp_path)
            published = read_published(tmp_path)
            if polled is not None and published[0] < polled:
                bad.append(("went back", polled, published[0]))
            if published:
                if not _whole(*published):
                    bad.append(("file", published[0]))
                seen.append(published[0])

    readers = [threading.Thread(target=f) for f in (in_process, in_process, from_files, from_files)]
    for t in readers:
        t.start()
    for v in range(1, 16):
        head, meta = _constant_head(v)
        # A candidate that claims to beat anything, so that every one is installed.
        claim = {"mae": -float(v), "mae_recent": -float(v), "concordance": 1.0, "scored": 20}
        assert lr.consider(Candidate(head, meta, rows, claim, 0.0))
        time.sleep(0.02)
    time.sleep(0.1)
    stop.set()
    for t in readers:
        t.join()
    assert not bad and len(set(seen)) > 3 and max(seen) == 15 and published_version(tmp_path) == 15
    assert sorted(p.name for p in (tmp_path / "heads").iterdir()) == ["v000013", "v000014", "v000015"]
    publish_head(tmp_path, 16, *_constant_head(16))  # a version directory left by a crash is rewritten whole
    publish_head(tmp_path, 16, *_constant_head(16))
    assert _whole(*read_published(tmp_path))


def test_a_background_refit_runs_in_a_low_priority_child_with_one_torch_thread(tmp_path):
    import os

    from predictor.online import BackgroundRefit

    lr = learner(tmp_path)
    feed(lr, traffic(200))
    with BackgroundRefit() as background:
        child = background._pool  # the worker the refits run in
        assert child.submit(os.getpid).result() != os.getpid()
        assert child.submit(os.nice, 0).result() == 19 and child.submit(torch.get_num_threads).result() == 1
        candidate = background.submit(lr.snapshot()).result(timeout=300)
    assert candidate.quality["concordance"] > 0.7 and lr.consider(candidate) and lr.current()[0] == 1


def test_a_refit_child_that_died_is_replaced_for_the_next_refit(tmp_path):
    import os
    from concurrent.futures.process import BrokenProcessPool

    from predictor.online import BackgroundRefit

    lr = learner(tmp_path)
    feed(lr, traffic(200))
    with BackgroundRefit() as background:
        with pytest.raises(BrokenProcessPool):
            background._pool.submit(os._exit, 1).result(timeout=120)  # the child killed, as by the OOM killer
        assert background.submit(lr.snapshot()).result(timeout=300).quality["scored"] > 0
