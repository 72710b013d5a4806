"""The model source always resolves to a folder of weights, so the weights hash covers real files."""

import pytest

from predictor.model_files import resolve_model_source, weights_hash
from tests import MODEL_DIR


def test_a_folder_passes_through_and_hashes_its_weights():
    assert resolve_model_source(str(MODEL_DIR)) == str(MODEL_DIR)
    assert len(weights_hash(MODEL_DIR)) == 16


def test_a_hub_id_that_is_not_cached_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="local cache"):
        resolve_model_source("no-such-org/no-such-model")


def test_a_folder_without_weights_has_no_hash(tmp_path):
    with pytest.raises(FileNotFoundError, match="safetensors"):
        weights_hash(tmp_path)
