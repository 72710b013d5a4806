"""Per-token prefill features of the serving model, from one forward pass.

ESTP predicts output length from what the serving model already computes at prefill, so the
features must come from that same model on its normal (sdpa) attention path: switching to eager
attention just to read attention weights would cost T x T memory per head and layer. Instead a
pre-hook grabs the last layer's attention input and rotary angles, and only that layer's Q/K are
recomputed, in bounded blocks, for the attention each token *receives*.

Batches are left-padded (the serving convention); position ids are rebuilt from the mask so a
prompt gets the same features alone or in a padded batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, Field
from torch import Tensor, nn


class FeatureConfig(BaseModel):
    """What to extract; entropy and attention are optional because avg/last pooling need neither."""

    # Index into the model's `hidden_states` convention: 0 = embeddings, i = output of decoder layer
    # i-1, num_layers (or -1) = final normed output, the state the LM head reads.
    layer: int = -1
    # Extra layer whose last-token state is returned too (TRAIL reads an intermediate layer).
    aux_layer: int | None = None
    entropy: bool = True
    attention: bool = True
    # Received attention divided by the number of queries that see the token; causal masking
    # otherwise makes early tokens look important just because more queries can see them.
    debias: bool = True
    # 1,024 rows x 49,152 vocab x 4 B = 200 MB of logits per chunk (two such buffers at the peak),
    # whatever the prompt length.
    entropy_chunk_rows: int = Field(1024, ge=1)
    # Scores held at once when recomputing attention (heads x query rows x keys), about 64 MB.
    attention_block_elems: int = Field(1 << 24, ge=1)


@dataclass
class PrefillFeatures:
    """Features of a left-padded batch; padding positions hold zeros."""

    hidden: Tensor  # [B, T, d] hidden states of the chosen layer
    mask: Tensor  # [B, T] bool, True on real tokens
    entropy: Tensor | None = None  # [B, T] next-token entropy over the full vocabulary, nats
    # [B, T] attention received in the final layer, mean over heads. The last real token receives
    # none under causal masking (no later query): it holds 0 here, and pooling decides what it means.
    attention_received: Tensor | None = None
    aux_last: Tensor | None = None  # [B, d] last real token's state at `aux_layer`


def pad_left(sequences: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Left padding keeps every prompt's last token in the final column, as in serving."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = True
    return ids, mask


MAX_PADDING = 0.125  # share of a micro-batch's tokens that may be padding


def micro_batches(lengths: list[int], max_batch_tokens: int, max_batch_size: int,
                  max_padding: float = MAX_PADDING) -> list[list[int]]:
    """Indices grouped by length so each group's padded size (size x longest) stays in budget and
    at most `max_padding` of it is padding.

    Padding is computed like any token, and on a CPU batching buys almost nothing else: eight
    prompts of a burst batched as they came (padded to the longest) prefilled at 0.6x the tokens/s
    of one at a time. Sorting first keeps padding small; a prompt longer than the budget goes alone.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    real = 0
    for i in order:
        # Ascending order: the newcomer is the group's longest member.
        padded = (len(groups[-1]) + 1) * lengths[i] if groups else 0
        if (groups and len(groups[-1]) < max_batch_size and padded <= max_batch_tokens
                and padded <= (1 + max_padding) * (real + lengths[i])):
            groups[-1].append(i)
            real += lengths[i]
        else:
            groups.append([i])
            real = lengths[i]
    return groups


def receiver_counts(mask: Tensor) -> Tensor:
    """Number of real queries after each token, i.e. how many can attend to it (self excluded)."""
    m = mask.long()
    return (m.flip(-1).cumsum(-1).flip(-1) - m) * m


def last_positions(mask: Tensor) -> Tensor:
    """Column of each row's last real token (the final column under left padding)."""
    return mask.shape[-1] - 1 - mask.long().flip(-1).argmax(-1)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + _rotate_half(x) * sin


@torch.no_grad()
def _entropy(final_hidden: Tensor, mask: Tensor, lm_head: nn.Module, chunk_rows: int) -> Tensor:
    """Entropy of softmax(lm_head(h)) for real tokens only, never holding more than a chunk of logits."""
    rows = final_hidden[mask]
    out = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    for start in range(0, rows.shape[0], chunk_rows):
        # In place: two [rows, V] buffers (log p, then p log p) at the peak, not four.
        logp = lm_head(rows[start:start + chunk_rows]).float()
        logp.sub_(torch.logsumexp(logp, dim=-1, keepdim=True))
        out[start:start + chunk_rows] = -logp.exp().mul_(logp).sum(-1)
    entropy = torch.zeros(mask.shape, dtype=torch.float32, device=rows.device)
    entropy[mask] = out
    return entropy


@torch.no_grad()
def _attention_received(
    attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, block_elems: int
) -> Tensor:
    """Sum over later real queries j > i of a_{j,i}, mean over heads, for the layer `attn`.

    Each row's real tokens are gathered first, which applies the padding mask exactly (padding
    neither queries nor is attended to) and skips work on padding; only the causal mask remains.
    Query rows go in blocks sized to `block_elems`, so memory does not grow with T^2.
    """
    n_heads = attn.config.num_attention_heads
    head_dim, groups, scale = attn.head_dim, attn.num_key_value_groups, attn.scaling
    received = torch.zeros(mask.shape, dtype=torch.float32, device=x.device)
    for row in range(x.shape[0]):
        keep = mask[row].nonzero().squeeze(-1)
        n = keep.numel()
        if n < 2:
            continue
        xs, c, s = x[row, keep], cos[row, keep], sin[row, keep]
        q = _rotary(attn.q_proj(xs).view(n, -1, head_dim).transpose(0, 1), c, s).float()
        k = _rotary(attn.k_proj(xs).view(n, -1, head_dim).transpose(0, 1), c, s).float()
        k = k.repeat_interleave(groups, dim=0)  # GQA: kv head h serves query heads h*groups...
        total = torch.zeros(n, dtype=torch.float32, device=x.device)
        step = max(1, block_elems // (n_heads * n))
        pos = torch.arange(n, device=x.device)
        for q0 in range(0, n, step):
            q1 = min(n, q0 + step)
            # Causality: queries < q1 see keys < q1 only.
            scores = torch.matmul(q[:, q0:q1], k[:, :q1].transpose(1, 2)) * scale
            future = pos[None, :q1] > pos[q0:q1, None]
            probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
            not_self = pos[None, :q1] != pos[q0:q1, None]
            total[:q1] += (probs * not_self).sum(dim=(0, 1))
        received[row, keep] = total / n_heads
    return received


def check_supported(model: nn.Module, config: FeatureConfig) -> None:
    """Raise at load time, not at the first prediction, if the model's attention cannot be recomputed.

    The received attention is rebuilt from the last layer's q_proj/k_proj and rotary angles
    (Llama, Qwen2, Mistral style); q/k norms (e.g. Qwen3) would change the scores unseen.
    """
    if not config.attention:
        return
    attn = model.base_model.layers[-1].self_attn
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        raise NotImplementedError(
            f"{type(attn).__name__} has q/k norms (e.g. Qwen3): ESTP's attention features are not supported "
            "for it yet; use a head that reads no attention (egtp, avg, last)")
    missing = [name for name in ("q_proj", "k_proj", "head_dim", "num_key_value_groups", "scaling")
               if not hasattr(attn, name)]
    if missing:
        raise NotImplementedError(f"{type(attn).__name__} lacks {missing}: its attention cannot be recomputed")
    _resolve_layer(config.layer, len(model.base_model.layers))


def _resolve_layer(index: int, num_layers: int) -> int:
    resolved = index + num_layers + 1 if index < 0 else index
    if not 0 <= resolved <= num_layers:
        raise ValueError(f"layer {index} outside 0..{num_layers} (or negative from the end)")
    return resolved


class _EarlyExit(Exception):
    """Raised by a forward hook to stop the prefill once the deepest layer wanted is computed:
    transformers' models have no argument to run only their first layers."""


@torch.no_grad()
def extract_features(
    model: nn.Module, input_ids: Tensor, mask: Tensor, config: FeatureConfig = FeatureConfig()
) -> PrefillFeatures:
    """One prefill of `model` (a *ForCausalLM) on a left-padded batch -> per-token features.

    The base model is called instead of the LM model so that full [B, T, V] logits never exist;
    the LM head runs only inside the chunked entropy.
    """
    base = model.base_model
    layers = base.layers
    num_layers = len(layers)
    device = next(model.parameters()).device
    input_ids, mask = input_ids.to(device), mask.to(device).bool()
    wanted = {_resolve_layer(config.layer, num_layers)}
    if config.aux_layer is not None:
        wanted.add(_resolve_layer(config.aux_layer, num_layers))

    captured: dict = {}
    hooks = []

    def keep_output(index: int):
        def hook(_module, _args, output):
            captured[index] = output[0] if isinstance(output, tuple) else output
        return hook

    for index in wanted - {num_layers}:
        module = base.embed_tokens if index == 0 else layers[index - 1]
        hooks.append(module.register_forward_hook(keep_output(index)))
    if config.attention:
        def grab_attention_input(_module, args, kwargs):
            captured["attn_in"] = args[0] if args else kwargs["hidden_states"]
            captured["rotary"] = kwargs["position_embeddings"]
        hooks.append(layers[-1].self_attn.register_forward_pre_hook(grab_attention_input, with_kwargs=True))

    # Early exit: when nothing reads the final layer (no entropy, no attention, no final-layer
    # pooling), the layers above the deepest one wanted are never run. The prefill's cost is
    # proportional to the layers it runs, and on a CPU it is paid by the engines' decoding.
    deepest = max(wanted)
    early = deepest < num_layers and not config.entropy and not config.attention
    if early:
        def stop(_module, _args, _output):
            raise _EarlyExit
        hooks.append((base.embed_tokens if deepest == 0 else layers[deepest - 1]).register_forward_hook(stop))

    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    try:
        final = base(input_ids=input_ids, attention_mask=mask.long(), position_ids=position_ids,
                     use_cache=False).last_hidden_state
        captured[num_layers] = final
    except _EarlyExit:
        final = None
    finally:
        for h in hooks:
            h.remove()

    zero_pad = mask.unsqueeze(-1)
    features = PrefillFeatures(
        hidden=(captured[_resolve_layer(config.layer, num_layers)] * zero_pad).float(), mask=mask
    )
    if config.aux_layer is not None:
        aux = captured[_resolve_layer(config.aux_layer, num_layers)]
        features.aux_last = aux[torch.arange(aux.shape[0]), last_positions(mask)].float()
    if config.entropy:
        features.entropy = _entropy(final, mask, model.get_output_embeddings(), config.entropy_chunk_rows)
    if config.attention:
        cos, sin = captured["rotary"]
        received = _attention_received(layers[-1].self_attn, captured["attn_in"], cos, sin, mask,
                                       config.attention_block_elems)
        if config.debias:
            received = received / receiver_counts(mask).clamp(min=1)
        features.attention_received = received
    return features
