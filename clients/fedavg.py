"""FedAvg's client rule: E epochs of mini-batch SGD from the received model (McMahan et al., 2017).

    w ← w^t;  for each mini-batch b:  w ← w − η (∇ℓ(w; b) + λ_wd w)   [momentum m, fresh each round]
    return w_{i,K}

This is exactly :class:`fedsuite.method.training.ClientRule`; the subclass exists so the method is a pair of files.
"""

from fedsuite.method.training import ClientRule


class FedAvgClient(ClientRule):
    """Plain local SGD (all hooks at their defaults)."""
