"""FedNova (Wang et al., NeurIPS 2020): normalised averaging (a FedNLR baseline; vanilla SGD,
so a_i = τ_i: the FedNLR paper gives no settings).

    Δ_i = w_{i,K} − w^t,   p_i = n_i / Σ_{j∈S} n_j,   τ_i = local steps (metric "num-steps")
    a_i = τ_i                                                  (plain local SGD)
    a_i = (τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)) / (1 − ρ)              (local momentum ρ = cfg.momentum > 0)
    τ_eff = Σ_i p_i a_i                      (the paper's τ_eff = Σ p_i τ_i for plain SGD)
    w^{t+1} = w^t + τ_eff Σ_i p_i Δ_i / a_i

Computed as a weighted mean with weights n_i/a_i followed by the scale s = τ_eff · Σ_i p_i/a_i:
w^{t+1} = m + (s − 1)(m − w^t),  m = Σ (n_i/a_i) w_{i,K} / Σ (n_i/a_i). With equal step counts s = 1 and
the result is FedAvg's aggregate bit for bit. Normalisation and scale act on trainable parameters;
buffers get the weighted mean. Clients are plain SGD (clients/fedavg.py); with --neuron-lr the
per-neuron rates are part of the local solver and a_i stays τ_i (our choice: the FedNLR paper names FedNova as a
partner but reports no such combination).
"""


from clients.fedavg import FedAvgClient
from fedsuite.method.arrays import NDArrays, server_step, weighted_mean
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import FedSuiteStrategy
from fedsuite.method.wire import NUM_STEPS, NUM_STEPS_RECORD, ClientReply, Records


def nova_norm(steps: float, momentum: float) -> float:
    """‖a_i‖₁ of the local solver: τ for SGD, (τ − ρ(1−ρ^τ)/(1−ρ))/(1−ρ) for SGD with momentum ρ."""
    if momentum == 0.0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class FedNovaStrategy(FedSuiteStrategy):
    """Step-normalised averaging."""

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.keys = setup.trainable_keys()

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        a = [max(nova_norm(r.metrics[NUM_STEPS], self.cfg.momentum), 1e-12) for r in replies]  # K_i: declared
        n = [float(r.num_examples) for r in replies]
        total = sum(n)
        ratio = [a[0] / ai for ai in a]  # exactly 1.0 when the step counts are equal
        tau_eff = sum(ni * ai for ni, ai in zip(n, a)) / total
        scale = tau_eff * sum(ni * ri for ni, ri in zip(n, ratio)) / (total * a[0])
        mean = weighted_mean([r.arrays for r in replies], [ni * ri for ni, ri in zip(n, ratio)], self.template)
        buffers = [k for k in self.template if k not in self.keys]
        if buffers:
            plain = weighted_mean([r.arrays for r in replies], n, self.template)
            mean.update({k: plain[k] for k in buffers})
        self.round_log.add({"fednova_tau_eff": tau_eff})
        return server_step(mean, self.global_arrays, scale, self.keys)


register_method(
    "fednova",
    strategy=FedNovaStrategy,
    client=FedAvgClient,
    summary="Normalised averaging: updates divided by local step counts, rescaled by tau_eff",
    paper="Wang et al., NeurIPS 2020",
    records=Records(reply=(NUM_STEPS_RECORD,)),
)
