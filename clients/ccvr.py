"""CCVR's client rule (Luo et al., NeurIPS 2021; spec fednlr.md §5 table, A18).

Training rounds are plain local SGD (FedAvg's ClientUpdate). In a *statistics round* (config key
``ccvr-stats`` = 1, sent by ``strategies/ccvr.py`` after the rounds it calibrates) the client does no
training: with the received global model w in eval mode it computes, over its whole local data
(normalised, not augmented), for every class c

    N_{i,c} = |{(x, y): y = c}|,   μ_{i,c} = (1/N_{i,c}) Σ_{y=c} f_w(x),
    Σ_{i,c} = (1/(N_{i,c} − 1)) Σ_{y=c} (f_w(x) − μ_{i,c})(f_w(x) − μ_{i,c})ᵀ   (0 when N_{i,c} < 2)

with f_w = ``model.features`` (the penultimate representation), and returns them as the extra
ArrayRecord ``ccvr-stats`` {counts [C], means [C, D], covs [C, D, D]} next to the unchanged w. The
statistics round bypasses the plug-ins (relaxed init, neuron-wise lr): it must describe w itself.
"""

from __future__ import annotations

import torch

from fedsuite.data import to_float
from fedsuite.training import ClientRule, LocalResult, LocalTask

STATS_FLAG = "ccvr-stats"


@torch.no_grad()
def feature_statistics(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bundle, num_classes: int,
                       batch_size: int = 1000) -> dict[str, torch.Tensor]:
    """Per-class count, mean and unbiased covariance of ``model.features`` (float64 sums)."""
    model.eval()
    dim = int(model.head.in_features)
    s1 = torch.zeros(num_classes, dim, dtype=torch.float64)
    s2 = torch.zeros(num_classes, dim, dim, dtype=torch.float64)
    counts = torch.bincount(y.to(torch.long).cpu(), minlength=num_classes)
    for start in range(0, int(y.shape[0]), batch_size):
        f = model.features(to_float(x[start : start + batch_size], bundle)).to(torch.float64).cpu()
        yb = y[start : start + batch_size].to(torch.long).cpu()
        s1.index_add_(0, yb, f)
        for c in torch.unique(yb).tolist():
            fc = f[yb == c]
            s2[c] += fc.T @ fc
    n = counts.to(torch.float64)
    means = s1 / n.clamp_min(1)[:, None]
    covs = (s2 - n[:, None, None] * means[:, :, None] * means[:, None, :]) / (n - 1).clamp_min(1)[:, None, None]
    covs[n < 2] = 0.0
    return {"counts": counts.to(torch.int64), "means": means.to(torch.float32), "covs": covs.to(torch.float32)}


class CCVRClient(ClientRule):
    """Plain local SGD; in a statistics round, no steps and the feature statistics of w."""

    @staticmethod
    def stats_round(task: LocalTask) -> bool:
        return bool(task.config.get(STATS_FLAG, 0))

    def run_start(self, task: LocalTask) -> None:
        if not self.stats_round(task):
            return super().run_start(task)
        task.model.load_state_dict(task.received)
        num_classes = int(task.model.head.out_features)
        task.scratch[STATS_FLAG] = feature_statistics(
            task.model, task.data.x, task.data.y, task.data.bundle, num_classes, task.cfg.eval_batch_size
        )

    def run_make_optimizer(self, task: LocalTask) -> torch.optim.Optimizer:
        if self.stats_round(task):
            return torch.optim.SGD(task.params, lr=0.0)  # never stepped
        return super().run_make_optimizer(task)

    def step(self, task: LocalTask, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
        if self.stats_round(task):
            return 0.0
        return super().step(task, opt, x, y)

    def run_finish(self, task: LocalTask) -> LocalResult:
        if not self.stats_round(task):
            return super().run_finish(task)
        return LocalResult(arrays=dict(task.received), extras={STATS_FLAG: task.scratch[STATS_FLAG]}, metrics={})
