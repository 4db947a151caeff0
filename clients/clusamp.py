"""CluSamp's client rule: plain local SGD (clients are stateless; the sampling is the server's).

Clustered sampling changes only *which* clients train (``strategies/clusamp.py``); the local update
is FedAvg's: w ← w − η (∇ℓ(w; b) + λ_wd w) from the received w^t.
"""

from fedsuite.method.training import ClientRule


class CluSampClient(ClientRule):
    """Plain local SGD (all hooks at their defaults)."""
