"""The SSJF/LTR proxy encoder loads offline from its PyPI package and embeds batch-invariantly."""

import torch

from predictor.proxy_encoder import ProxyEncoder

torch.set_num_threads(1)


def test_embeddings_are_unit_length_and_independent_of_batching():
    encoder = ProxyEncoder(max_batch_tokens=16)  # tiny budget: several padded micro-batches
    texts = ["Say hi.", "Write a long story about a dragon who learns to fly over the sea.", "Name a colour."]
    together = encoder.encode(texts)
    assert together.shape == (3, encoder.dim) == (3, 384)
    assert torch.allclose(together.norm(dim=-1), torch.ones(3), atol=1e-5)
    alone = torch.cat([encoder.encode([t]) for t in texts])
    assert torch.allclose(together, alone, atol=1e-5)
    assert (together[0] @ together[2]) < 0.99  # different prompts, different embeddings
