"""CCVR's client rule (Luo et al., NeurIPS 2021; a baseline of FedNLR's Table 2).

Training rounds are plain local SGD (FedAvg's ClientUpdate). A *statistics query* (message type
``query.statistics``, sent by ``strategies/ccvr.py`` after the rounds it calibrates) trains nothing:
with the received global model w in eval mode the client computes, over its whole local data
(normalised, not augmented), for every class c

    N_{i,c} = |{(x, y): y = c}|,   μ_{i,c} = (1/N_{i,c}) Σ_{y=c} f_w(x),
    Σ_{i,c} = (1/(N_{i,c} − 1)) Σ_{y=c} (f_w(x) − μ_{i,c})(f_w(x) − μ_{i,c})ᵀ   (0 when N_{i,c} < 2)

with f_w = ``model.features`` (the penultimate representation), and returns them as the
``statistics`` record {counts [C], means [C, D], covs [C, D, D]}. The query sees no plug-in (relaxed
init, neuron-wise lr): it must describe w itself.
"""

from __future__ import annotations

import torch

from fedsuite.method.training import ClientRule, LocalData
from fedsuite.method.wire import ARRAYS_KIND, STATISTICS, Record, Records

#: the entries of a statistics reply's record: N_{i,c} [C], μ_{i,c} [C, D], Σ_{i,c} [C, D, D]
COUNTS, MEANS, COVS = "counts", "means", "covs"
#: CCVR's records (``fedsuite.method.wire.Records``): every statistics reply holds the three entries
RECORDS = Records(statistics=(Record(STATISTICS, ARRAYS_KIND, entries=(COUNTS, MEANS, COVS)),))


#: the samples per forward pass of :func:`feature_statistics`: a constant, not ``eval_batch_size``,
#: because the float64 sums' last bits follow the chunking, and through the calibrated head (virtual
#: features drawn from these statistics) so would the run's accuracy
STATISTICS_BATCH = 1000


@torch.no_grad()
def feature_statistics(model: torch.nn.Module, data: LocalData, num_classes: int,
                       batch_size: int = STATISTICS_BATCH) -> dict[str, torch.Tensor]:
    """Per-class count, mean and unbiased covariance of ``model.features`` over ``data`` (float64 sums)."""
    model.eval()
    y = data.y
    dim = int(model.head.in_features)
    s1 = torch.zeros(num_classes, dim, dtype=torch.float64)
    s2 = torch.zeros(num_classes, dim, dim, dtype=torch.float64)
    counts = torch.bincount(y.to(torch.long).cpu(), minlength=num_classes)
    for start in range(0, int(y.shape[0]), batch_size):
        f = model.features(data.inputs(slice(start, start + batch_size))).to(torch.float64).cpu()
        yb = y[start : start + batch_size].to(torch.long).cpu()
        s1.index_add_(0, yb, f)
        for c in torch.unique(yb).tolist():
            fc = f[yb == c]
            s2[c] += fc.T @ fc
    n = counts.to(torch.float64)
    means = s1 / n.clamp_min(1)[:, None]
    covs = (s2 - n[:, None, None] * means[:, :, None] * means[:, None, :]) / (n - 1).clamp_min(1)[:, None, None]
    covs[n < 2] = 0.0
    return {COUNTS: counts.to(torch.int64), MEANS: means.to(torch.float32), COVS: covs.to(torch.float32)}


class CCVRClient(ClientRule):
    """Plain local SGD; a statistics query gets the per-class feature statistics of the received w."""

    def statistics(self, model: torch.nn.Module, data: LocalData, cfg) -> dict[str, torch.Tensor]:
        num_classes = int(model.head.out_features)
        return feature_statistics(model, data, num_classes)
