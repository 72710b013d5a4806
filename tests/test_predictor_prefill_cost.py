"""The predictor times a prefill at its start and says what each answer's prefill took: what the
router's predictor budget prices predictions with (the model on CPU, no Ray)."""

import asyncio

import pytest

from deployments.predictor_deployment import LengthPredictor
from router.serving.config import head_checkpoint
from router.serving.predictor_client import PREFILL
from tests import MODEL_DIR


def test_a_prefill_is_timed_at_start_and_each_answer_carries_its_share_of_its_batch():
    predictor = LengthPredictor.func_or_class(str(MODEL_DIR), {"last": str(head_checkpoint("last"))},
                                              max_batch_size=4, truncate_prompt_tokens=16)

    batch = LengthPredictor.func_or_class._predict_batch.__wrapped__  # one batch, without Serve's batching

    async def run():
        measured = await predictor.measured_prefill()
        return measured, await batch(predictor, [list(range(1, 41)), [1, 2, 3], [10**9]], [None] * 3)

    measured, (long, short, invalid) = asyncio.run(run())
    assert measured["tokens"] == 16 and measured["seconds"] > 0  # the prompt a prediction reads at most
    assert "last" in long and long[PREFILL]["tokens"] == 16 and short[PREFILL]["tokens"] == 3  # its tail only
    assert long[PREFILL]["seconds"] == pytest.approx(16 / 3 * short[PREFILL]["seconds"])  # shared by tokens
    assert short[PREFILL]["seconds"] > 0 and "error" in invalid and PREFILL not in invalid
