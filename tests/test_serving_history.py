"""The length history: keys, bounds, censored lengths, atomic writes off the event loop, restarts,
two router replicas sharing one file, and files it must refuse (no server)."""

import asyncio
import json
import logging
import threading

import pytest

from router.serving.history import LengthHistory, prompt_key


def _history(path, model="m", max_prompts=100, per_prompt=4) -> LengthHistory:
    return LengthHistory(path, model, max_prompts, per_prompt, flush_interval_s=3600)


def _record_and_flush(history: LengthHistory, rows) -> None:
    async def run():
        for key, tokens, censored in rows:
            history.record(key, tokens, censored)
        await history.flush()

    asyncio.run(run())


def test_a_key_is_the_prompts_ids_and_the_model_never_its_text(tmp_path):
    assert prompt_key("m", [1, 2, 3]) == prompt_key("m", [1, 2, 3])
    assert prompt_key("m", [1, 2, 3]) != prompt_key("m", [1, 23]) != prompt_key("other", [1, 2, 3])
    history = _history(tmp_path / "h.json")
    _record_and_flush(history, [(history.key([5, 6]), 10, False)])
    assert "5,6" not in (tmp_path / "h.json").read_text()


def test_lengths_come_back_as_their_stats_and_a_cut_at_zero_says_nothing(tmp_path):
    history = _history(tmp_path / "h.json")
    assert history.lookup("k") is None
    _record_and_flush(history, [("k", 10, False), ("k", 30, True), ("j", 0, True)])
    stats = history.lookup("k")
    assert (stats.mean_tokens, stats.count) == (20.0, 2)  # the cut 30 only says "at least 30"
    assert history.lookup("j") is None


def test_each_prompt_keeps_its_latest_lengths_and_the_least_recently_finished_prompts_go_first(tmp_path):
    history = _history(tmp_path / "h.json", max_prompts=2, per_prompt=2)
    _record_and_flush(history, [("a", 1, False), ("b", 2, False), ("a", 3, False), ("a", 5, False),
                                ("c", 7, False)])
    assert history.lookup("a").mean_tokens == 4.0  # 1 forgotten: 3 and 5 kept
    assert history.lookup("b") is None and history.lookup("c").count == 1  # b finished least recently


def test_the_history_survives_a_restart_and_is_written_off_the_event_loop(tmp_path):
    history = _history(tmp_path / "h.json")
    writers = []
    write = history._write
    history._write = lambda new: writers.append(threading.get_ident()) or write(new)
    _record_and_flush(history, [("k", 12, False), ("k", 20, True)])
    assert writers and writers[0] != threading.get_ident()
    assert not list(tmp_path.glob(".h.json.*"))  # the temporary file was renamed into place
    restarted = _history(tmp_path / "h.json")
    assert restarted.lookup("k") == history.lookup("k") and restarted.lookup("k").count == 2


def test_two_replicas_sharing_a_file_keep_each_others_lengths(tmp_path):
    one, two = _history(tmp_path / "h.json"), _history(tmp_path / "h.json")
    _record_and_flush(one, [("k", 10, False)])
    _record_and_flush(two, [("k", 30, False), ("j", 5, False)])  # two read the file again before writing
    assert two.lookup("k").count == 2
    _record_and_flush(one, [("j", 7, False)])
    assert one.lookup("j").count == 2 and one.lookup("k").count == 2  # one learned two's lengths
    assert _history(tmp_path / "h.json").lookup("k").mean_tokens == 20.0


def test_a_corrupt_file_is_moved_aside_and_a_new_history_starts(tmp_path, caplog):
    path = tmp_path / "h.json"
    path.write_text('{"format": "lengthserve-length-hist')
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        history = _history(path)
    assert "refused" in caplog.text and "moved aside" in caplog.text
    assert list(tmp_path.glob("h.json.corrupt-*")) and history.lookup("k") is None
    _record_and_flush(history, [("k", 3, False)])
    assert json.loads(path.read_text())["prompts"]["k"][1] == [[3, False]]


def test_another_models_file_is_refused_left_alone_and_requests_still_served(tmp_path, caplog):
    path = tmp_path / "h.json"
    _record_and_flush(_history(path, model="other"), [("k", 3, False)])
    before = path.read_text()
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        history = _history(path, model="m")
    assert "refused" in caplog.text and "'other'" in caplog.text
    _record_and_flush(history, [("k", 9, False)])  # remembered in memory, never written over theirs
    assert history.lookup("k").mean_tokens == 9.0 and not history.persisting
    assert path.read_text() == before


@pytest.mark.parametrize("body", [{"format": "lengthserve-length-history", "version": 1, "model": "m",
                                   "prompts": {"k": [1.0, [["x", False]]]}}, [1, 2, 3]])
def test_a_malformed_file_is_refused_as_corrupt(tmp_path, body):
    path = tmp_path / "h.json"
    path.write_text(json.dumps(body))
    assert _history(path).lookup("k") is None and list(tmp_path.glob("h.json.corrupt-*"))


def test_closing_writes_what_is_not_yet_written(tmp_path):
    history = _history(tmp_path / "h.json")

    async def run():
        history.record("k", 4, False)  # the flush is 3600 s away

    asyncio.run(run())
    history.close()
    assert _history(tmp_path / "h.json").lookup("k").count == 1
