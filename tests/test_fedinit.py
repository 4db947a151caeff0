"""FedInit / relaxed initialisation (spec fedinit.md §8): the maths as pure functions, the plug-in at
hook level (``make_task`` + the shared loop), the server side at strategy level, and real Flower
simulations for the end-to-end equivalences (β = 0 ≡ FedAvg, client-state ≡ server-state,
fedinit ≡ fedavg + RI).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict

from clients.fedavg import FedAvgClient
from fedsuite.method.training import ClientRule
import fedsuite.method.plugins.relaxed_init
from fedsuite.method.activity import joint_norm
from fedsuite.method.plugins.relaxed_init import (
    RELAXATION,
    STATE_NAME,
    RelaxedInit,
    RelaxedInitServer,
    relaxed_start,
)
from fedsuite.method import registry
from fedsuite.method.arrays import weighted_mean
from fedsuite.config import ConfigError, build_config
from fedsuite.method.plugins import active_plugins
from fedsuite.method.replies import Reply
from fedsuite.method.training import run_local_training
from fedsuite.method.wire import to_ndarrays, to_record
from tests.conftest import FAST, assert_same_arrays, make_strategy, make_task


#: the methods' maths, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess

# --------------------------------------------------------------------------------------------
# helpers: one client round at hook level, a federated loop of such rounds
# --------------------------------------------------------------------------------------------


def client_round(values, pid, global_sd, server_round, state_dir, rule_factory=None, plugins=None):
    """One client's local training through the real loop and plug-ins, starting from ``global_sd``."""
    task, cfg = make_task(values, pid=pid, server_round=server_round, state_dir=state_dir)
    task.model.load_state_dict(global_sd)
    task.received = {k: v.detach().clone() for k, v in global_sd.items()}
    plugins = active_plugins(cfg) if plugins is None else plugins
    rule = rule_factory(pid, plugins) if rule_factory else FedAvgClient(plugins=plugins)
    result = run_local_training(rule, task)
    w_k = {k: v.detach().clone() for k, v in task.model.state_dict().items()}
    return task, result, w_k


def mean_model(replies: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    arrays = [{k: v.numpy() for k, v in r.items()} for r in replies]
    out = weighted_mean(arrays, [1.0] * len(arrays), arrays[0])
    return {k: torch.from_numpy(v) for k, v in out.items()}


def w0_state(values) -> dict[str, torch.Tensor]:
    task, _ = make_task(values)
    return {k: v.clone() for k, v in task.model.state_dict().items()}


# --------------------------------------------------------------------------------------------
# §8.1 the formula and its sign
# --------------------------------------------------------------------------------------------


def test_relaxed_start_formula_and_sign():
    g, hat = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([0.0, 4.0])}
    w0 = relaxed_start(g, hat, 0.1, ["w"])["w"]
    torch.testing.assert_close(w0, torch.tensor([1.1, 1.8]))
    # β > 0 moves away from ŵ, anti-parallel to ŵ − w^t
    assert torch.linalg.norm(w0 - hat["w"]) > torch.linalg.norm(g["w"] - hat["w"])
    cos = torch.nn.functional.cosine_similarity(w0 - g["w"], hat["w"] - g["w"], dim=0)
    assert float(cos) == pytest.approx(-1.0)
    # β = 0: w^t bit for bit (the very tensor, no arithmetic); β = -1: ŵ
    assert relaxed_start(g, hat, 0.0, ["w"])["w"] is g["w"]
    torch.testing.assert_close(relaxed_start(g, hat, -1.0, ["w"])["w"], hat["w"])


# --------------------------------------------------------------------------------------------
# §8.8 closed-form quadratic: identical Hessians, full participation, delta mode
# --------------------------------------------------------------------------------------------


class QuadraticGD(ClientRule):
    """Full-batch GD on f_i(w) = ½‖w − a_i‖² (one step per batch; one batch per epoch here)."""

    def __init__(self, target, plugins):
        super().__init__(plugins)
        self.target = target

    def step(self, task, opt, x, y):
        with torch.no_grad():
            for name, p in task.model.named_parameters():
                p -= task.lr * (p - self.target[name])
        return 0.0


@pytest.mark.parametrize("beta", [0.0, 0.1, -0.1])
def test_quadratic_closed_form(beta, tmp_path):
    values = {"num_clients": 5, "clients_per_round": 5, "batch_size": 100_000, "local_epochs": 3, "lr": 0.1,
              "relaxed_init.beta": beta}
    n, q = 5, 0.9 ** 3  # q = (1 − η)^K, K = 3 steps
    w = w0_state(values)
    keys = [k for k in w]
    gen = torch.Generator().manual_seed(1)
    targets = [{k: torch.randn(v.shape, generator=gen) for k, v in w.items()} for _ in range(n)]
    a_bar = {k: sum(t[k] for t in targets) / n for k in keys}
    D = [{k: torch.zeros_like(w[k]) for k in keys} for _ in range(n)]
    for t in range(1, 5):
        replies, finals = [], []
        for pid in range(n):
            _, res, w_k = client_round(values, pid, w, t, tmp_path / f"c{pid}",
                                       rule_factory=lambda i, pl: QuadraticGD(targets[i], pl))
            assert res.metrics["num-steps"] == 3
            replies.append(res.arrays)
            finals.append(w_k)
        new = mean_model(replies)
        for k in keys:  # global trajectory = FedAvg's for every β: w^{t+1} = ā + q (w^t − ā)
            torch.testing.assert_close(new[k], a_bar[k] + q * (w[k] - a_bar[k]), atol=2e-6, rtol=1e-5)
        for i in range(n):  # D_i^{t+1} = (1−q)(a_i − ā) − qβ D_i^t
            for k in keys:
                expected = (1 - q) * (targets[i][k] - a_bar[k]) - q * beta * D[i][k]
                D[i][k] = finals[i][k] - new[k]
                torch.testing.assert_close(D[i][k], expected, atol=2e-6, rtol=1e-5)
        w = new
    # steady state shrinks by 1/(1+qβ) for β > 0, grows for β < 0
    fixed = (1 - q) * (targets[0][keys[0]] - a_bar[keys[0]]) / (1 + q * beta)
    torch.testing.assert_close(D[0][keys[0]], fixed, atol=0.05 * float(fixed.abs().max()), rtol=0)


# --------------------------------------------------------------------------------------------
# §8.2/§8.3/§2.4: first visit, bookkeeping, stale ŵ_i, staleness cut-off (client-state, on disk)
# --------------------------------------------------------------------------------------------


def _perturbed(sd, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in sd.items()}


def test_client_state_first_visit_stale_and_staleness(tmp_path):
    values = {"relaxed_init.beta": 0.1, "batch_size": 100_000, "local_epochs": 2, "lr": 0.5}
    w0 = w0_state(values)
    keys = [k for k in w0]
    # round 1: every client starts at w^0 exactly (ŵ_i = w^0), whatever β is
    task, res, w_k1 = client_round(values, 0, w0, 1, tmp_path / "s")
    for k in keys:
        assert torch.equal(task.start_point[k], w0[k])
    stored = task.state.load_arrays(STATE_NAME)
    assert int(stored.pop("__round__")) == 1
    for k in keys:  # ŵ_i := w_{i,K}, neither w_{i,0} nor w^t
        assert torch.equal(stored[k], w_k1[k])
    assert not all(torch.equal(stored[k], w0[k]) for k in keys)
    # unsampled in rounds 2-3; in round 4 (a fresh process: new ClientState on the same disk) it
    # starts from the stale ŵ_i of round 1
    g4 = _perturbed(w0, 0.05, seed=4)
    task4, res4, w_k4 = client_round(values, 0, g4, 4, tmp_path / "s")
    for k in keys:
        assert torch.equal(task4.start_point[k], g4[k] + 0.1 * (g4[k] - w_k1[k]))
        # delta upload: w^t + (w_{i,K} − w_{i,0})
        torch.testing.assert_close(res4.arrays[k], g4[k] + (w_k4[k] - task4.start_point[k]), atol=1e-6, rtol=0)
    # max_staleness: ŵ_i made 3 rounds ago, limit 2 -> zero offset; limit 3 -> relaxed
    for limit, relaxed in [(2, False), (3, True)]:
        v = {**values, "relaxed_init.max_staleness": limit}
        _, _, _ = client_round(v, 1, w0, 1, tmp_path / f"st{limit}")
        t, r, wk = client_round(v, 1, g4, 4, tmp_path / f"st{limit}")
        moved = any(not torch.equal(t.start_point[k], g4[k]) for k in keys)
        assert moved == relaxed
        if not relaxed:  # no offset: the reply is w_{i,K} itself
            assert all(torch.equal(r.arrays[k], wk[k]) for k in keys)
    # a client first sampled in round 3: w^t + β (w^t − w^0) ("w0"), or w^t ("zero_offset")
    g3 = _perturbed(w0, 0.05, seed=3)
    t, _, _ = client_round(values, 2, g3, 3, tmp_path / "fresh")
    for k in keys:
        assert torch.equal(t.start_point[k], g3[k] + 0.1 * (g3[k] - w0[k]))
    t, r, wk = client_round({**values, "relaxed_init.first_visit": "zero_offset"}, 2, g3, 3, tmp_path / "fresh0")
    assert all(torch.equal(t.start_point[k], g3[k]) for k in keys)
    assert all(torch.equal(r.arrays[k], wk[k]) for k in keys)


# --------------------------------------------------------------------------------------------
# activity (issue 39, item 2): offset_i = ‖w_{i,0} − w^t‖ / ‖w^t‖, reported by every client
# --------------------------------------------------------------------------------------------


def _offset(a: dict, b: dict, keys) -> float:
    """‖a − b‖ / ‖b‖ over ``keys``, computed here as the definition reads."""
    return joint_norm(a[k] - b[k] for k in keys) / joint_norm(b[k] for k in keys)


def test_relaxed_init_offset_known_answers(tmp_path):
    """0 where relaxation does not move the start (round 1: ŵ_i = w^0 is the model sent; β = 0;
    a first visit with ``zero_offset``; ŵ_i past ``max_staleness``); otherwise ‖w_{i,0} − w^t‖ /
    ‖w^t‖ = β ‖w^t − ŵ_i‖ / ‖w^t‖, well above the 1e-4 threshold here; server-state mode, sent the
    same w_{i,0}, reports the same number."""
    values = {"relaxed_init.beta": 0.1, "batch_size": 100_000, "local_epochs": 2, "lr": 0.5}
    w0 = w0_state(values)
    keys = [n for n, _ in make_task(values)[0].model.named_parameters()]
    _, res1, w_k1 = client_round(values, 0, w0, 1, tmp_path / "s")
    assert res1.metrics[RELAXATION.measure] == 0.0
    g4 = _perturbed(w0, 0.05, seed=4)
    task4, res4, _ = client_round(values, 0, g4, 4, tmp_path / "s")
    offset = res4.metrics[RELAXATION.measure]
    assert offset == _offset(task4.start_point, g4, keys)  # the same float32 w_{i,0} − w^t, then float64 norms
    assert offset == pytest.approx(0.1 * _offset(w_k1, g4, keys), rel=1e-5)  # β ‖w^t − ŵ_i‖ / ‖w^t‖
    assert offset > 10 * RELAXATION.threshold and RELAXATION.threshold == 1e-4
    # no relaxation: exactly 0
    assert client_round({**values, "relaxed_init.beta": 0.0}, 1, g4, 4, tmp_path / "b0")[1].metrics[
        RELAXATION.measure] == 0.0
    g3 = _perturbed(w0, 0.05, seed=3)
    assert client_round({**values, "relaxed_init.first_visit": "zero_offset"}, 2, g3, 3, tmp_path / "z")[1].metrics[
        RELAXATION.measure] == 0.0
    stale = {**values, "relaxed_init.max_staleness": 2}
    client_round(stale, 1, w0, 1, tmp_path / "st")
    assert client_round(stale, 1, g4, 4, tmp_path / "st")[1].metrics[RELAXATION.measure] == 0.0
    # server-state mode: the client trains from the w_{i,0} the server sent and measures the same
    task, cfg = make_task({**values, "relaxed_init.storage": "server-state"}, pid=0, server_round=4,
                          extras={"start": {k: task4.start_point[k].clone() for k in keys}})
    task.model.load_state_dict(g4)
    task.received = {k: v.clone() for k, v in g4.items()}
    result = run_local_training(FedAvgClient(plugins=active_plugins(cfg)), task)
    assert result.metrics[RELAXATION.measure] == offset


def test_measuring_the_offset_does_not_change_training(tmp_path, monkeypatch):
    """Rounds 1 and 4 of one client with the offset measured and with the measurement switched off
    (a ``start_offset`` that computes nothing): the start point, the reply, the stored ŵ_i, every
    metric but the offset, the round's generator and torch's global RNG state are identical bit
    for bit."""
    values = {"relaxed_init.beta": 0.1, "batch_size": 32, "local_epochs": 1, "lr": 0.5}
    w0 = w0_state(values)
    g4 = _perturbed(w0, 0.05, seed=4)

    def two_rounds(folder):
        torch.manual_seed(3)
        client_round(values, 0, w0, 1, folder)
        task, result, w_k = client_round(values, 0, g4, 4, folder)
        stored = task.state.load_arrays(STATE_NAME)
        return task, result, stored, torch.get_rng_state(), task.generator.get_state()

    measured = two_rounds(tmp_path / "measured")
    monkeypatch.setattr(fedsuite.method.plugins.relaxed_init, "start_offset", lambda relaxed, start: -1.0)
    unmeasured = two_rounds(tmp_path / "unmeasured")
    (task_m, res_m, stored_m, rng_m, gen_m), (task_u, res_u, stored_u, rng_u, gen_u) = measured, unmeasured
    assert res_m.metrics[RELAXATION.measure] > 0 and res_u.metrics[RELAXATION.measure] == -1.0
    for a, b in [(task_m.start_point, task_u.start_point), (res_m.arrays, res_u.arrays), (stored_m, stored_u)]:
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert {k: v for k, v in res_m.metrics.items() if k != RELAXATION.measure} == \
        {k: v for k, v in res_u.metrics.items() if k != RELAXATION.measure}
    assert torch.equal(rng_m, rng_u) and torch.equal(gen_m, gen_u)


def test_beta_zero_is_fedavg_at_hook_level(tmp_path):
    g = _perturbed(w0_state({}), 0.05, seed=9)
    _, plain, wk_plain = client_round({}, 3, g, 5, tmp_path / "a")
    t, ri, wk_ri = client_round({"relaxed_init.beta": 0.0}, 3, g, 5, tmp_path / "b")
    assert_same_arrays({k: v.numpy() for k, v in plain.arrays.items()}, {k: v.numpy() for k, v in ri.arrays.items()})
    assert not t.state.has_arrays(STATE_NAME)  # β = 0 never reads ŵ_i, so it does not write it


def test_buffers_are_not_relaxed(tmp_path):
    """Spec A18: only trainable parameters move; buffers keep the host's (received) values."""
    values = {"relaxed_init.beta": 0.1}
    task, cfg = make_task(values, pid=0, server_round=3, state_dir=tmp_path)
    task.model.register_buffer("running_stat", torch.full((4,), 2.0))  # a BatchNorm-like buffer
    task.model.head.weight.requires_grad_(False)  # a frozen parameter is not relaxed either
    g = _perturbed(task.model.state_dict(), 0.05, seed=2)
    task.model.load_state_dict(g)
    task.received = {k: v.clone() for k, v in g.items()}
    run_local_training(FedAvgClient(plugins=active_plugins(cfg)), task)
    frozen = {"running_stat", "head.weight"}
    for k in g:
        assert torch.equal(task.start_point[k], g[k]) == (k in frozen), k


# --------------------------------------------------------------------------------------------
# §8.5 / §8.6 aggregation modes
# --------------------------------------------------------------------------------------------


def _federated(values, rounds, tmp_path, tag, rule_factory=None):
    w = w0_state(values)
    traj = [w]
    for t in range(1, rounds + 1):
        replies = [client_round(values, pid, w, t, tmp_path / f"{tag}{pid}", rule_factory)[1].arrays
                   for pid in range(values["num_clients"])]
        w = mean_model(replies)
        traj.append(w)
    return traj


def test_delta_and_model_agree_under_full_participation(tmp_path):
    # 5 clients, all sampled; 2 full-batch CE steps each (cheap, but real non-linear training)
    full = {"num_clients": 5, "clients_per_round": 5, "batch_size": 100_000, "local_epochs": 2, "lr": 0.5}
    base = {**full, "relaxed_init.beta": 0.1}
    delta = _federated({**base, "relaxed_init.aggregation": "delta"}, 3, tmp_path, "d")
    model = _federated({**base, "relaxed_init.aggregation": "model"}, 3, tmp_path, "m")
    plain = _federated(full, 3, tmp_path, "p")
    for a, b in zip(delta, model):
        assert_same_arrays({k: v.numpy() for k, v in a.items()}, {k: v.numpy() for k, v in b.items()}, exact=False)
    # ... and RI really changed the trajectory
    assert any(not torch.allclose(delta[-1][k], plain[-1][k]) for k in delta[-1])


class NoStep(ClientRule):
    def step(self, task, opt, x, y):
        return 0.0


def test_zero_gradient_delta_keeps_model_average_extrapolates(tmp_path):
    """§8.6: without local progress, delta mode keeps w^t; model mode gives w^t + β(w^t − mean ŵ)."""
    values = {"clients_per_round": 10, "relaxed_init.beta": 0.1}
    w0 = w0_state(values)
    g = _perturbed(w0, 0.05, seed=5)  # round 2, nobody trained before: ŵ_i = w^0
    for mode in ("delta", "model"):
        v = {**values, "relaxed_init.aggregation": mode}
        replies = [client_round(v, pid, g, 2, tmp_path / f"{mode}{pid}", lambda i, pl: NoStep(pl))[1].arrays
                   for pid in range(10)]
        new = mean_model(replies)
        for k in w0:
            expected = g[k] if mode == "delta" else g[k] + 0.1 * (g[k] - w0[k])
            torch.testing.assert_close(new[k], expected, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------
# server-state mode at strategy level: personalised starts, bookkeeping, checkpoint round-trip
# --------------------------------------------------------------------------------------------


#: FedAvg with relaxed_init in server-state mode as the ServerApp builds it (conftest's ``make_strategy``,
#: with a ``run_dir`` and the ``data_root``): FAST's clients and cohort, the run's failure bound
SERVER_STATE = {"num_clients": FAST["num_clients"], "cohort": FAST["clients_per_round"], "unit_round": False,
                "build_model": True, "relaxed_init.beta": 0.1, "relaxed_init.storage": "server-state"}


def _starts(strategy, server_round, arrays):
    """The start point ``"start"`` each sampled partition is sent, by partition id."""
    contents = strategy.configure_round(server_round, arrays)
    return {pid: to_ndarrays(content["start"]) for pid, content in contents.items()}


def _fake_round(strategy, server_round, arrays, seed):
    """Send, then reply with w_{i,K} = w_{i,0} + noise; returns (starts, raw w_{i,K}, new global)."""
    starts = _starts(strategy, server_round, arrays)
    rng = np.random.default_rng(seed)
    raw, replies = {}, {}
    for pid, start in sorted(starts.items()):
        w_k = {k: (start[k] + 0.01 * rng.standard_normal(v.shape).astype(v.dtype)) if k in start else v
               for k, v in arrays.items()}
        raw[pid] = w_k
        replies[pid] = Reply(RecordDict({"arrays": to_record(w_k), "metrics": MetricRecord({"num-examples": 10.0, "train-loss": 1.0})}))
    new, _ = strategy.aggregate_round(server_round, replies)
    return starts, raw, new


def test_server_state_bookkeeping_and_checkpoint(tmp_path, data_root):
    s1 = make_strategy("fedavg", run_dir=tmp_path / "run", data_root=str(data_root), **SERVER_STATE)
    setup = s1.setup
    assert isinstance(s1.server_hooks[0], RelaxedInitServer)
    w0 = setup.initial
    starts1, raw1, w1 = _fake_round(s1, 1, w0, seed=1)
    for start in starts1.values():  # round 1: every start is w^0
        assert_same_arrays(start, {k: w0[k] for k in start})
    # delta: w^{t+1} = w^t + mean(w_K − w_0) (= mean w_K here, offsets are 0)
    expected = weighted_mean(list(raw1.values()), [1.0] * len(raw1), w0)
    assert_same_arrays(w1, expected, exact=False)
    state = s1.checkpoint_state()
    assert state["plugins"]["relaxed_init"]["index"] == {pid: 1 for pid in starts1}
    # round 2: sampled-before clients start from w^1 + β(w^1 − ŵ_i), ŵ_i = their raw w_K; others from w^0
    starts2, raw2, w2 = _fake_round(s1, 2, w1, seed=2)
    for pid, start in starts2.items():
        hat = raw1[pid] if pid in raw1 else w0
        for k in start:
            exp = (torch.from_numpy(w1[k]) + 0.1 * (torch.from_numpy(w1[k]) - torch.from_numpy(hat[k]))).numpy()
            assert np.array_equal(start[k], exp)
    # delta mode: the global model moves by the mean Δ_i measured from the relaxed starts
    keys = list(next(iter(starts2.values())))
    mean_delta = {k: np.mean([raw2[p][k].astype(np.float64) - starts2[p][k] for p in starts2], axis=0) for k in keys}
    for k, d in mean_delta.items():
        np.testing.assert_allclose(w2[k], w1[k] + d, atol=1e-6)
    # checkpoint from after round 1, restored into a fresh strategy (the round-2 files exist on disk):
    # round 2 is replayed exactly as s1 played it
    s3 = make_strategy("fedavg", run_dir=tmp_path / "run", data_root=str(data_root), **SERVER_STATE)
    s3.load_checkpoint_state(state)
    replay = _starts(s3, 2, w1)
    assert replay.keys() == starts2.keys()
    for pid in replay:
        assert_same_arrays(replay[pid], starts2[pid])
    # without a checkpoint, a fresh strategy resumes from the newest generation on disk
    s4 = make_strategy("fedavg", run_dir=tmp_path / "run", data_root=str(data_root), **SERVER_STATE)
    assert s4.server_hooks[0].index == {**{p: 1 for p in starts1}, **{p: 2 for p in starts2}}


# --------------------------------------------------------------------------------------------
# every registered method takes --relaxed-init or refuses it clearly
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(registry.methods()))
def test_every_method_accepts_relaxed_init_or_says_why(name, tmp_path, data_root):
    from typer.testing import CliRunner

    from fedsuite.cli.main import app

    spec = registry.methods()[name]
    values = {**FAST, "data_root": str(data_root), "strategy": name, "relaxed_init.beta": 0.1}
    if "relaxed_init" not in spec.refuses:
        cfg = build_config(values=values)  # accepted
        rule = spec.client(plugins=active_plugins(cfg))
        assert any(isinstance(p, RelaxedInit) for p in rule.plugins)
        # the server side is wired for this method's strategy (server-state mode)
        strategy = make_strategy(name, run_dir=tmp_path, data_root=str(data_root), **SERVER_STATE)
        assert any(isinstance(h, RelaxedInitServer) for h in strategy.server_hooks)
    else:
        with pytest.raises(ConfigError, match=f"relaxed_init does not apply to {name}"):
            build_config(values=values)
        out = CliRunner().invoke(app, ["simulate", "--strategy", name, "--relaxed-init", "0.1",
                                       "--set", f"data_root={data_root}", "--output-dir", str(tmp_path)])
        assert out.exit_code == 2, out.output
        assert "relaxed_init does not apply" in out.output and not any(tmp_path.iterdir())


def test_refusal_message_names_method_and_reason(monkeypatch, tmp_path, data_root):
    """The refusal path, exercised even while every registered method accepts RI."""
    from typer.testing import CliRunner

    from fedsuite.cli.main import app

    spec = registry.methods()["fedavg"]
    monkeypatch.setitem(registry._METHODS, "fedavg", dataclasses.replace(spec, refuses={"relaxed_init": "no start point here"}))
    out = CliRunner().invoke(app, ["simulate", "--strategy", "fedavg", "--relaxed-init", "0.1",
                                   "--set", f"data_root={data_root}", "--output-dir", str(tmp_path)])
    assert out.exit_code == 2
    assert "relaxed_init does not apply to fedavg: no start point here" in " ".join(out.output.split())


def test_fedinit_enables_relaxed_init_at_registration():
    """fedinit is FedAvg's two rules with relaxed_init switched on by its registration: β = 0.1 on
    both sides (client rule and the strategy's server hooks) unless the run sets β itself."""
    from strategies.fedinit import DEFAULT_BETA

    cfg = build_config(values={**FAST, "strategy": "fedinit"})
    assert cfg.relaxed_init.beta is None
    assert [(type(p), p.p.beta) for p in active_plugins(cfg)] == [(RelaxedInit, DEFAULT_BETA)] and DEFAULT_BETA == 0.1
    cfg = build_config(values={**FAST, "strategy": "fedinit", "relaxed_init.beta": 0.05})  # a user-set β wins
    assert [p.p.beta for p in active_plugins(cfg)] == [0.05]
    strategy = make_strategy("fedinit", {"w": np.zeros(2, np.float32)}, num_clients=FAST["num_clients"],
                             cohort=FAST["clients_per_round"], unit_round=False, **{"relaxed_init.storage": "server-state"})
    assert [type(h) for h in strategy.server_hooks] == [RelaxedInitServer]


def test_a_refused_plugin_is_an_error_on_the_flower_run_path(monkeypatch):
    """A refusal declared at registration is enforced by config validation itself, so the run
    config a ServerApp/ClientApp reads (``flwr run .``) is refused like the CLI's."""
    from fedsuite.config import from_run_config, to_run_config

    flat = to_run_config(build_config(values={**FAST, "strategy": "fedavg", "relaxed_init.beta": 0.1}))
    spec = registry.methods()["fedavg"]
    monkeypatch.setitem(registry._METHODS, "fedavg", dataclasses.replace(spec, refuses={"relaxed_init": "no start point"}))
    with pytest.raises(ConfigError, match="relaxed_init does not apply to fedavg: no start point"):
        from_run_config(flat)


# --------------------------------------------------------------------------------------------
# real Flower simulations (4 configs besides the shared plain FedAvg run)
# --------------------------------------------------------------------------------------------


def _rows(sim, drop=("wall_seconds",)):
    return [{k: v for k, v in r.items() if k not in drop} for r in sim.rows]


def test_beta_zero_equals_fedavg_bit_for_bit(simulate):
    plain = simulate(strategy="fedavg")
    ri0 = simulate(strategy="fedavg", **{"relaxed_init.beta": 0.0})
    assert_same_arrays(plain.arrays, ri0.arrays)
    # the same rows, but for the offset every round of RI reports: 0, so the summary calls it inert
    assert _rows(plain) == _rows(ri0, ("wall_seconds", RELAXATION.measure))
    assert [r[RELAXATION.measure] for r in ri0.rows[1:]] == [0.0, 0.0]
    assert ri0.summary["activity"] == {"relaxed_init": {"measure": RELAXATION.measure, "mean": 0.0, "last": 0.0,
                                                        "threshold": 1e-4, "rounds": 2, "inert": True}}
    assert "activity" not in plain.summary  # FedAvg has no component to measure


RI3 = {"rounds": 3}


def test_storage_modes_identical_and_fedinit_is_fedavg_plus_ri(simulate):
    client = simulate(strategy="fedinit", **RI3)
    server = simulate(strategy="fedinit", **RI3, **{"relaxed_init.storage": "server-state"})
    cohorts = [set(r["cohort"]) for r in client.rows if r["round"] > 0]
    assert cohorts[2] & (cohorts[0] | cohorts[1]), "some client must come back, so ŵ_i is used"
    # identical models and metrics; only the download differs (personalised 'start' records)
    assert_same_arrays(client.arrays, server.arrays)
    assert _rows(client, ("wall_seconds", "bytes_sent")) == _rows(server, ("wall_seconds", "bytes_sent"))
    for a, b in zip(client.rows[1:], server.rows[1:]):
        assert b["bytes_sent"] > a["bytes_sent"]
    assert (server.run_dir / "relaxed-init-server").is_dir()
    # client-state mode keeps ŵ_i on the clients' disks, one per client that trained
    trained = set().union(*cohorts)
    assert {int(p.parent.name.split("-")[1]) for p in (client.run_dir / "client-state").glob(f"client-*/{STATE_NAME}.r*.pt")} == trained
    # fedinit is fedavg + RI with β = 0.1, nothing else
    ri = simulate(strategy="fedavg", **RI3, **{"relaxed_init.beta": 0.1})
    assert_same_arrays(client.arrays, ri.arrays)
    assert _rows(client) == _rows(ri)
    # round 1 everyone starts at w^0 (FedAvg's round 1); from round 2 RI changes the run
    plain = simulate(strategy="fedavg")
    assert _rows(client, ("wall_seconds", RELAXATION.measure))[1] == _rows(plain)[1]
    assert _rows(client)[2]["test_loss"] != _rows(plain)[2]["test_loss"]
    # the offset each round (the cohort mean; identical in both storage modes, compared above): 0 in
    # round 1, then the relaxation moves the starts; the summary records its mean, last value, threshold
    offsets = [r[RELAXATION.measure] for r in client.rows[1:]]
    assert offsets[0] == 0.0 and min(offsets[1:]) > RELAXATION.threshold
    for sim in (client, server):
        assert sim.summary["activity"] == {"relaxed_init": {
            "measure": RELAXATION.measure, "mean": pytest.approx(sum(offsets) / 3, rel=1e-12), "last": offsets[-1],
            "threshold": 1e-4, "rounds": 3, "inert": False}}
