"""Prefill features checked against what the model itself computes with eager attention."""


import pytest
import torch

from predictor.features import FeatureConfig, extract_features, pad_left, receiver_counts
from tests import MODEL_DIR

torch.set_num_threads(1)

PROMPTS = ["Hi", "Write a short poem about the sea, please.", "What is 2 + 2?"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    assert m.config._attn_implementation == "sdpa"
    return m


@pytest.fixture(scope="module")
def batch(tokenizer):
    seqs = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        for p in PROMPTS
    ]
    assert len({len(s) for s in seqs}) == len(seqs)  # really padded
    return seqs, *pad_left(seqs, tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def eager_out(batch):
    from transformers import AutoModelForCausalLM

    _, ids, mask = batch
    eager = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return eager(input_ids=ids, attention_mask=mask.long(), position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0),
                     output_attentions=True, output_hidden_states=True)


def test_pad_left_and_receiver_counts():
    ids, mask = pad_left([[5, 6, 7], [8]], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [2, 2, 8]]
    assert receiver_counts(mask).tolist() == [[2, 1, 0], [0, 0, 0]]


@pytest.mark.parametrize("debias", [True, False])
def test_received_attention_matches_eager(model, batch, eager_out, debias):
    _, ids, mask = batch
    f = extract_features(model, ids, mask, FeatureConfig(debias=debias, entropy=False))
    weights = eager_out.attentions[-1]  # [B, heads, T, T]
    for row in range(ids.shape[0]):
        keep = mask[row].nonzero().squeeze(-1)
        a = weights[row][:, keep][:, :, keep]
        expected = a.tril(-1).sum(dim=1).mean(dim=0)  # later queries only, self excluded
        if debias:
            expected = expected / torch.arange(len(keep) - 1, -1, -1).clamp(min=1)
        got = f.attention_received[row, keep]
        assert (got - expected).abs().max() < 1e-5 * max(1.0, expected.abs().max().item())
        assert got[-1] == 0  # the last token has no later query
        assert (f.attention_received[row, ~mask[row]] == 0).all()


def test_entropy_matches_full_logits(model, batch):
    _, ids, mask = batch
    f = extract_features(model, ids, mask, FeatureConfig(attention=False, entropy_chunk_rows=7))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask.long(),
                       position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0)).logits
    logp = torch.log_softmax(logits, dim=-1)
    full = -(logp.exp() * logp).sum(-1)
    assert (f.entropy[mask] - full[mask]).abs().max() < 1e-4
    assert (f.entropy[~mask] == 0).all()


def test_hidden_layers_follow_hidden_states_convention(model, batch, eager_out):
    _, ids, mask = batch
    reference = eager_out.hidden_states  # embeddings, layer 1 .. layer L-1 outputs, final normed
    f = extract_features(model, ids, mask, FeatureConfig(layer=12, aux_layer=-1, entropy=False, attention=False))
    # sdpa vs eager: float noise relative to residual-stream magnitudes of ~100
    assert torch.allclose(f.hidden[mask], reference[12][mask], rtol=1e-4, atol=1e-4)
    assert torch.allclose(f.aux_last, reference[-1][:, -1], rtol=1e-4, atol=1e-4)
    assert (f.hidden[~mask] == 0).all()


def test_an_early_layer_stops_the_prefill_there(model, batch, eager_out):
    _, ids, mask = batch
    ran = []
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i))
             for i, layer in enumerate(model.base_model.layers)]
    try:
        f = extract_features(model, ids, mask, FeatureConfig(layer=4, entropy=False, attention=False))
        early_ran, ran[:] = list(ran), []
        extract_features(model, ids, mask, FeatureConfig(layer=4, entropy=True, attention=False))  # entropy: to the end
    finally:
        for h in hooks:
            h.remove()
    assert early_ran == [0, 1, 2, 3]
    assert ran == list(range(len(model.base_model.layers)))
    assert torch.allclose(f.hidden[mask], eager_out.hidden_states[4][mask], rtol=1e-4, atol=1e-4)
    assert f.entropy is None and f.attention_received is None


def test_padding_invariance_and_blocking(model, batch):
    seqs, ids, mask = batch
    batched = extract_features(model, ids, mask)
    tiny_blocks = FeatureConfig(attention_block_elems=9 * 40 * 3, entropy_chunk_rows=5)
    for row, seq in enumerate(seqs):
        alone = extract_features(model, *pad_left([seq], 2), tiny_blocks)
        keep = mask[row]
        assert (batched.hidden[row, keep] - alone.hidden[0]).abs().max() < 1e-4
        assert (batched.entropy[row, keep] - alone.entropy[0]).abs().max() < 1e-4
        assert (batched.attention_received[row, keep] - alone.attention_received[0]).abs().max() < 1e-5
