"""Every trained configuration the benchmark compares, by name: the paper's methods, ESTP's
ablations and its lambda sweep, as data over predictor/train.py's recipes.

Baselines that use an auxiliary model (SSJF-Reg, SSJF-MC, LTR-C) read a frozen proxy encoder's
mean-pooled embedding (predictor/proxy_encoder.py), so their recipe's pooling is "avg"; all
others read the serving model's prefill. Every method predicts its expected length from the same
head; LTR-C's ranking loss fixes only the order, so its scores are mapped onto the training length
distribution (quantile matching) before they are compared in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from predictor.pooling import PoolingConfig
from predictor.train import RECIPES, Recipe

GROUPS = ("methods", "ablations", "lambda_sweep")
LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Variant:
    recipe: Recipe
    group: str
    label: str  # as the paper's tables name it
    proxy: bool = False  # proxy encoder embedding instead of the serving model's prefill features
    debias: bool = True  # positional debiasing of received attention (ESTP's S)

    @property
    def ranking(self) -> bool:
        return self.recipe.loss == "rank"

    def key(self) -> str:
        """Identical trainings share one result (the lambda sweep's 0.5 is ESTP itself)."""
        return repr((self.recipe, self.proxy, self.debias))


_ESTP = RECIPES["estp"]
_PROXY = PoolingConfig(method="avg")

VARIANTS: dict[str, Variant] = {
    "estp": Variant(_ESTP, "methods", "ESTP"),
    "egtp": Variant(RECIPES["egtp"], "methods", "EGTP"),
    "avg": Variant(RECIPES["avg"], "methods", "Average pooling"),
    "last": Variant(RECIPES["last"], "methods", "Last token"),
    "trail": Variant(RECIPES["trail"], "methods", "TRAIL"),
    # SSJF regresses the length (a loss on the expected length only) or classifies it into bins.
    "ssjf_reg": Variant(Recipe(_PROXY, "smoothl1"), "methods", "SSJF-Reg", proxy=True),
    "ssjf_mc": Variant(Recipe(_PROXY, "ce", bins=10), "methods", "SSJF-MC", proxy=True),
    "ltr_c": Variant(Recipe(_PROXY, "rank"), "methods", "LTR-C", proxy=True),
    "estp_no_debias": Variant(_ESTP, "ablations", "w/o Pos. Debiasing", debias=False),
    "estp_no_smoothl1": Variant(replace(_ESTP, loss="crps"), "ablations", "w/o SmoothL1 (CRPS only)"),
    "estp_no_crps": Variant(replace(_ESTP, loss="smoothl1"), "ablations", "w/o CRPS (SmoothL1 only)"),
    **{
        f"estp_lam{lam:g}": Variant(replace(_ESTP, pooling=_ESTP.pooling.model_copy(update={"lam": lam})),
                                     "lambda_sweep", f"lambda = {lam:g}")
        for lam in LAMBDAS
    },
}


def select(names: list[str]) -> dict[str, Variant]:
    """Variant names and group names ("methods", "ablations", "lambda_sweep", "all") -> variants."""
    chosen: list[str] = []
    for name in names:
        if name == "all":
            chosen += list(VARIANTS)
        elif name in GROUPS:
            chosen += [n for n, v in VARIANTS.items() if v.group == name]
        elif name in VARIANTS:
            chosen.append(name)
        else:
            raise ValueError(f"unknown method {name!r}; choose from {[*VARIANTS, *GROUPS, 'all']}")
    return {n: VARIANTS[n] for n in dict.fromkeys(chosen)}
