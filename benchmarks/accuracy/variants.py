"""Every trained configuration the benchmark compares, by name: the paper's methods, ESTP's
ablations and its lambda sweep, and the attempts to train ESTP toward the ceiling, as data over
predictor/train.py's recipes.

Baselines that use an auxiliary model (SSJF-Reg, SSJF-MC, LTR-C) read a frozen proxy encoder's
mean-pooled embedding (predictor/proxy_encoder.py), so their recipe's pooling is "avg"; the
TF-IDF baselines read the prompt text (benchmarks/accuracy/text_baseline.py); all others read the
serving model's prefill. Every head predicts a distribution and its expected length; LTR-C's
ranking loss fixes only the order, so its scores are mapped onto the training length
distribution (quantile matching) before they are compared in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from predictor.pooling import PoolingConfig
from predictor.train import RECIPES, Recipe

GROUPS = ("methods", "ablations", "lambda_sweep", "toward_ceiling")
LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Variant:
    recipe: Recipe
    group: str
    label: str  # as the paper's tables name it
    # What the model reads: the serving model's prefill features, a proxy encoder's embedding, or the text.
    inputs: Literal["prefill", "proxy", "text"] = "prefill"
    model: Literal["head", "logistic", "ridge"] = "head"  # a length head, or a TF-IDF linear model
    debias: bool = True  # positional debiasing of received attention (ESTP's S)

    @property
    def ranking(self) -> bool:
        return self.recipe.loss == "rank"

    def key(self) -> str:
        """Identical trainings share one result (the lambda sweep's 0.5 is ESTP itself)."""
        return repr((self.recipe, self.inputs, self.model, self.debias))


_ESTP = RECIPES["estp"]
_PROXY = PoolingConfig(method="avg")
_TEXT = Recipe(PoolingConfig(method="avg"), "ce")  # only its bin count is read


def refit(recipe: Recipe, **changes) -> Recipe:
    """The recipe with other head-fitting settings (predictor.fit.FitConfig fields)."""
    return replace(recipe, fit=recipe.fit.model_copy(update=changes))


def _views(*views: str) -> PoolingConfig:
    return _ESTP.pooling.model_copy(update={"method": "concat", "views": list(views)})

VARIANTS: dict[str, Variant] = {
    "estp": Variant(_ESTP, "methods", "ESTP"),
    "egtp": Variant(RECIPES["egtp"], "methods", "EGTP"),
    "avg": Variant(RECIPES["avg"], "methods", "Average pooling"),
    "last": Variant(RECIPES["last"], "methods", "Last token"),
    "trail": Variant(RECIPES["trail"], "methods", "TRAIL"),
    # SSJF regresses the length (a loss on the expected length only) or classifies it into bins.
    "ssjf_reg": Variant(Recipe(_PROXY, "smoothl1"), "methods", "SSJF-Reg", inputs="proxy"),
    "ssjf_mc": Variant(Recipe(_PROXY, "ce", bins=10), "methods", "SSJF-MC", inputs="proxy"),
    "ltr_c": Variant(Recipe(_PROXY, "rank"), "methods", "LTR-C", inputs="proxy"),
    "tfidf": Variant(_TEXT, "methods", "TF-IDF + logistic", inputs="text", model="logistic"),
    "tfidf_reg": Variant(_TEXT, "methods", "TF-IDF + ridge", inputs="text", model="ridge"),
    "estp_no_debias": Variant(_ESTP, "ablations", "w/o Pos. Debiasing", debias=False),
    "estp_no_smoothl1": Variant(replace(_ESTP, loss="crps"), "ablations", "w/o SmoothL1 (CRPS only)"),
    "estp_no_crps": Variant(replace(_ESTP, loss="smoothl1"), "ablations", "w/o CRPS (SmoothL1 only)"),
    **{
        f"estp_lam{lam:g}": Variant(replace(_ESTP, pooling=_ESTP.pooling.model_copy(update={"lam": lam})),
                                     "lambda_sweep", f"lambda = {lam:g}")
        for lam in LAMBDAS
    },
    "estp_median": Variant(refit(_ESTP, targets="median"), "toward_ceiling", "median target"),
    "estp_distribution": Variant(refit(_ESTP, targets="distribution"), "toward_ceiling", "distribution target (ProD)"),
    "estp_wd": Variant(refit(_ESTP, weight_decay=0.1), "toward_ceiling", "weight decay 0.1"),
    "estp_dropout": Variant(refit(_ESTP, dropout=0.3), "toward_ceiling", "dropout 0.3"),
    "estp_small": Variant(refit(_ESTP, hidden=64), "toward_ceiling", "hidden 64"),
    "estp_std": Variant(refit(_ESTP, standardise=True), "toward_ceiling", "standardised inputs"),
    "estp_uncalibrated": Variant(refit(_ESTP, calibrate="none"), "toward_ceiling", "w/o calibration"),
    "estp_temperature": Variant(refit(_ESTP, calibrate="temperature"), "toward_ceiling",
                                "temperature calibration instead of quantile"),
    "estp_ens5": Variant(refit(_ESTP, members=5), "toward_ceiling", "ensemble of 5 seeds"),
    "estp_last": Variant(replace(_ESTP, pooling=_views("estp", "last")), "toward_ceiling", "ESTP + last token"),
    "estp_avg_last": Variant(replace(_ESTP, pooling=_views("estp", "avg", "last")), "toward_ceiling",
                             "ESTP + average + last token"),
    "estp_last_ens5": Variant(refit(replace(_ESTP, pooling=_views("estp", "last")), members=5), "toward_ceiling",
                              "ESTP + last token, ensemble of 5"),
    "last_ens5": Variant(RECIPES["last_ens5"], "toward_ceiling", "last token, ensemble of 5"),
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
