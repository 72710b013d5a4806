"""Length bins and the MLP head that maps a pooled prompt vector to a distribution over them.

A distribution rather than a single number, because the same prompt sampled again gives a spread
of lengths: the router can act on the expected length, a quantile (p90 for conservative
batching), or the most likely bin.

Default bins (`LengthBins.from_lengths`): quantile edges of the training lengths, so every bin
holds about the same number of examples (balanced targets for the CE/CRPS terms, fine resolution
where lengths are dense). Generation stops at `max_tokens`, which piles up a spike of truncated
samples; when that spike is more than 1/K of the data it gets a bin of its own,
(max_tokens - 1, max_tokens], instead of being blurred with the longest regular answers.
Centres are the mean training length inside each bin, not the midpoint: the mean is the best
single value for a bin's lengths, which matters for wide bins and for the truncation spike.
Without training lengths, `LengthBins.log_spaced` gives edges that are relatively equally fine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from pydantic import BaseModel, model_validator
from torch import Tensor, nn

DEFAULT_QUANTILES = (0.1, 0.5, 0.9)


class LengthBins(BaseModel):
    """Bin k holds lengths in (edges[k], edges[k+1]]; edges run from 0 to max_tokens."""

    edges: list[float]
    centres: list[float]
    max_tokens: int

    @model_validator(mode="after")
    def _consistent(self) -> "LengthBins":
        e = self.edges
        if len(e) < 2 or len(self.centres) != len(e) - 1:
            raise ValueError("need K+1 edges and K centres, K >= 1")
        if any(b <= a for a, b in zip(e, e[1:])):
            raise ValueError(f"edges must increase: {e}")
        if any(not e[k] <= c <= e[k + 1] for k, c in enumerate(self.centres)):
            raise ValueError("every centre must lie inside its bin")
        return self

    @property
    def k(self) -> int:
        return len(self.centres)

    @classmethod
    def log_spaced(cls, k: int = 20, max_tokens: int = 1024, first_edge: float = 4.0) -> "LengthBins":
        edges = [0.0] + torch.logspace(math.log10(first_edge), math.log10(max_tokens), k, dtype=torch.float64).tolist()
        edges[-1] = float(max_tokens)
        return cls(edges=edges, centres=[(a + b) / 2 for a, b in zip(edges, edges[1:])], max_tokens=max_tokens)

    @classmethod
    def from_lengths(cls, lengths, k: int = 20, max_tokens: int = 1024) -> "LengthBins":
        """Quantile edges from training lengths (at most K bins: ties can merge some)."""
        y = torch.as_tensor(lengths, dtype=torch.float32).clamp(1, max_tokens)
        truncated = y >= max_tokens
        spike = bool(truncated.float().mean() > 1.0 / k) and k > 1
        body = y[~truncated] if spike and (~truncated).any() else y
        inner = torch.quantile(body, torch.linspace(0, 1, (k - 1 if spike else k) + 1))[1:-1].round()
        cuts = {float(e) for e in inner.tolist() if 0 < e < max_tokens}
        if spike:
            cuts.add(float(max_tokens - 1))
        edges = [0.0, *sorted(cuts), float(max_tokens)]
        e = torch.tensor(edges)
        index = cls._index(e, y)
        centres = [
            y[index == b].mean().item() if (index == b).any() else (edges[b] + edges[b + 1]) / 2
            for b in range(len(edges) - 1)
        ]
        return cls(edges=edges, centres=centres, max_tokens=max_tokens)

    @staticmethod
    def _index(edges: Tensor, lengths: Tensor) -> Tensor:
        return torch.searchsorted(edges[1:-1].contiguous(), lengths.float().contiguous(), side="left")

    def edges_t(self) -> Tensor:
        return torch.tensor(self.edges, dtype=torch.float32)

    def centres_t(self) -> Tensor:
        return torch.tensor(self.centres, dtype=torch.float32)

    def index(self, lengths: Tensor) -> Tensor:
        """Bin of each length; lengths beyond max_tokens fall in the last bin."""
        return self._index(self.edges_t().to(lengths.device), lengths)

    def soft_labels(self, index: Tensor, tau: float = 1.0) -> Tensor:
        """p_j proportional to exp(-|j - i| / tau) around the true bin i (EGTP's targets)."""
        j = torch.arange(self.k, device=index.device, dtype=torch.float32)
        return torch.softmax(-(j[None, :] - index[:, None].float()).abs() / tau, dim=-1)

    def expected(self, probs: Tensor) -> Tensor:
        return probs @ self.centres_t().to(probs.device)

    def cdf(self, probs: Tensor, lengths: Tensor) -> Tensor:
        """P(length <= x) for each row's x, lengths spread uniformly inside each bin."""
        edges = self.edges_t().to(probs.device)
        x = lengths.float().to(probs.device)
        k = self.index(x).clamp(max=self.k - 1)
        below = torch.cat([torch.zeros_like(probs[:, :1]), probs.cumsum(-1)], dim=-1).gather(-1, k[:, None]).squeeze(-1)
        frac = ((x - edges[k]) / (edges[k + 1] - edges[k])).clamp(0, 1)
        return below + frac * probs.gather(-1, k[:, None]).squeeze(-1)

    def capped_mean(self, probs: Tensor, cap: float) -> Tensor:
        """E[min(length, cap)] per row: bin centres below the cap, the cap above it, and in the bin
        the cap cuts, lengths spread uniformly below it. A request's `max_tokens` caps its real
        length, so it caps what the router expects of it."""
        edges, centres = self.edges_t().to(probs.device), self.centres_t().to(probs.device)
        lo, hi = edges[:-1], edges[1:]
        below = ((cap - lo) / (hi - lo)).clamp(0, 1)
        cut = below * (lo + cap) / 2 + (1 - below) * cap
        value = torch.where(hi <= cap, centres, torch.where(lo >= cap, torch.full_like(centres, cap), cut))
        return probs.float() @ value

    def training_quantile(self, q: float) -> float:
        """The q-quantile of the lengths the head was trained on: the bins are quantile bins of
        them (about 1/K each), so it lies a fraction of the way through bin floor(q * K)."""
        position = q * self.k
        k = min(int(position), self.k - 1)
        return self.edges[k] + (position - k) * (self.edges[k + 1] - self.edges[k])

    def survival(self, probs: Tensor, lengths: Tensor) -> Tensor:
        """P(length >= c) for each row's c: all that a request stopped by its max_tokens = c tells.

        Lengths are integers, l standing for (l - 1, l] as in predictor.calibration, so this is the
        mass above c - 1, the bin that c - 1 cuts counted by its uniform share. At or beyond
        max_tokens the bins end: such lengths all fall in the last bin (`index` puts them there and
        training counts a truncated sample there), so a request censored at the cap is in the last
        bin and its survival is that bin's mass. With a spike bin (max_tokens - 1, max_tokens] the two
        rules agree at c = max_tokens; with a wider last bin only the cap's rule keeps a truncated
        sample where an exact label of max_tokens would put it.
        """
        edges = self.edges_t().to(probs.device)
        c = lengths.float().to(probs.device)
        k = self.index(c - 1).clamp(max=self.k - 1)
        above = probs.flip(-1).cumsum(-1).flip(-1)  # above[:, j] = mass of bins j..K-1
        above = torch.cat([above, torch.zeros_like(probs[:, :1])], dim=-1)
        frac_below = ((c - 1 - edges[k]) / (edges[k + 1] - edges[k])).clamp(0, 1)
        inside = (1 - frac_below) * probs.gather(-1, k[:, None]).squeeze(-1)
        below_cap = above.gather(-1, (k + 1)[:, None]).squeeze(-1) + inside
        return torch.where(c >= self.max_tokens, probs[:, -1], below_cap)

    def quantile(self, probs: Tensor, q: float) -> Tensor:
        """Inverse CDF, assuming lengths spread uniformly inside each bin."""
        edges = self.edges_t().to(probs.device)
        cdf = probs.cumsum(-1)
        k = torch.searchsorted(cdf, torch.full((probs.shape[0], 1), q, device=probs.device)).clamp(max=self.k - 1)
        p_k = probs.gather(-1, k).squeeze(-1)
        below = cdf.gather(-1, k).squeeze(-1) - p_k
        frac = ((q - below) / p_k.clamp(min=1e-12)).clamp(0, 1)
        k = k.squeeze(-1)
        return edges[k] + frac * (edges[k + 1] - edges[k])


def remap_cdf(probs: Tensor, cdf_map: Tensor) -> Tensor:
    """Probabilities whose CDF at every bin edge is R(F): R piecewise linear through
    `cdf_map` at 0, 1/M, ..., 1 (predictor.calibration fits it)."""
    m = len(cdf_map) - 1
    position = probs.cumsum(-1).clamp(0, 1) * m
    k = position.floor().clamp(max=m - 1).long()
    knots = cdf_map.to(probs.device)
    cdf = knots[k] + (position - k) * (knots[k + 1] - knots[k])
    cdf[:, -1] = 1.0
    return torch.diff(cdf, dim=-1, prepend=torch.zeros_like(cdf[:, :1])).clamp(min=0)


class LengthHead(nn.Module):
    """EGTP's MLP, Linear(d, h) -> LayerNorm -> ReLU -> Dropout -> Linear(h, K) with h = d/2 by
    default, returning logits; optionally an ensemble of several such MLPs.

    Fixed transforms travel with the weights, so serving applies exactly what evaluation
    measured: input standardisation (`shift`, `scale`; identity unless `fit_standardisation`
    set them from training inputs), and the calibration fitted after training on held-out prompts
    (predictor.calibration) that makes the quantiles the router reads honest: a logit
    `temperature` and/or a map of the predicted CDF (`cdf_map`). An ensemble (members trained
    from different seeds) averages the members' probabilities; its logits are the log of that
    average.
    """

    def __init__(self, in_dim: int, num_bins: int, dropout: float = 0.1, hidden: int | None = None,
                 members: int = 1):
        super().__init__()
        hidden = hidden or in_dim // 2
        self.members = nn.ModuleList(
            nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.ReLU(), nn.Dropout(dropout),
                          nn.Linear(hidden, num_bins))
            for _ in range(members)
        )
        self.register_buffer("shift", torch.zeros(in_dim))
        self.register_buffer("scale", torch.ones(in_dim))
        self.temperature = 1.0
        self.cdf_map: Tensor | None = None

    def fit_standardisation(self, x: Tensor) -> None:
        """Per-dimension z-scores from training inputs: a few huge hidden dimensions would otherwise
        dominate the first layer."""
        self.shift.copy_(x.mean(0))
        self.scale.copy_(x.std(0).clamp(min=1e-6))

    def uncalibrated(self, pooled: Tensor) -> Tensor:
        x = (pooled - self.shift) / self.scale
        if len(self.members) == 1:
            return self.members[0](x)
        log_probs = torch.stack([m(x).log_softmax(-1) for m in self.members])
        return torch.logsumexp(log_probs, dim=0) - math.log(len(self.members))

    def forward(self, pooled: Tensor) -> Tensor:
        logits = self.uncalibrated(pooled) / self.temperature
        if self.cdf_map is None:
            return logits
        return remap_cdf(logits.softmax(-1), self.cdf_map).clamp(min=1e-12).log()


@dataclass
class LengthPrediction:
    expected_tokens: float
    quantiles: dict[str, float]  # "p10", "p50", "p90"
    bin: int  # most probable bin
    probabilities: list[float]


def summarise(probs: Tensor, bins: LengthBins, quantiles=DEFAULT_QUANTILES) -> list[LengthPrediction]:
    """Per-prompt predictions from [N, K] probabilities."""
    probs = probs.detach().float().cpu()
    expected = bins.expected(probs).tolist()
    qs = {f"p{round(q * 100)}": bins.quantile(probs, q).tolist() for q in quantiles}
    modes = probs.argmax(-1).tolist()
    return [
        LengthPrediction(
            expected_tokens=expected[i],
            quantiles={name: values[i] for name, values in qs.items()},
            bin=modes[i],
            probabilities=probs[i].tolist(),
        )
        for i in range(probs.shape[0])
    ]
