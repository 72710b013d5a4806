"""Learning the length head from the traffic it serves (the library half; the serving stack wires it).

- reservoir: a bounded, stratified sample of served requests that a burst cannot take over;
- refit: a candidate head from a snapshot of it, with the offline training loop (predictor.fit);
- learner: joins features and labels, keeps the reservoir, installs candidates that win;
- publish: versioned heads for the replicas, never half-written;
- schedule: when to refit, and refits in a low-priority child process;
- quality: held-out MAE and concordance with censored requests.
"""

from predictor.online.learner import OnlineLearner, online_bins
from predictor.online.publish import published_version, read_published
from predictor.online.refit import Candidate, RefitData, fit_candidate
from predictor.online.schedule import BackgroundRefit, RefitPolicy

__all__ = ["BackgroundRefit", "Candidate", "OnlineLearner", "RefitData", "RefitPolicy", "fit_candidate",
           "online_bins", "published_version", "read_published"]
