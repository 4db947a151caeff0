"""The CUDA path (``pytest -m gpu`` on a machine with a GPU; skipped, with the reason, without one).

Every registered method runs 2 rounds on CUDA on the in-process engine (its client rule and server
maths on the GPU, with no Ray start per method); both plug-ins and the image model run on Flower's
Simulation Engine with virtual clients sharing the GPU (``--num-gpus 0.25``, Ray's GPU placement).
No client reply may be dropped (a dropped reply fails the run, see ``max_failed_fraction``) and the
global model must change. Two runs with one seed must give identical metrics on the GPU
(``torch.use_deterministic_algorithms`` + ``CUBLAS_WORKSPACE_CONFIG``), and the two engines must give
the same metrics, as they do on the CPU (tests/test_registry_e2e.py).
Each run's summary.json names the GPU's model (``provenance``).
An image dataset with batch augmentation covers the device-side augmentation draws.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsuite.method.registry import methods

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible: the GPU tests need one"),
]

ON_GPU = {"device": "cuda", "num_gpus": 0.25, "num_clients": 6, "clients_per_round": 3, "rounds": 2}
IN_PROCESS_ON_GPU = {**ON_GPU, "num_gpus": 0.0, "engine": "inprocess"}


def assert_trained_without_failures(run) -> None:
    assert [r["round"] for r in run.rows] == [0, 1, 2]
    assert all(r["dropped"] == [] and r["failed"] == 0 for r in run.rows[1:])
    assert run.summary["status"] == "completed" and run.summary["failed_replies"] == 0
    first, last = run.rows[0], run.rows[-1]
    assert (last["test_accuracy"], last["test_loss"]) != (first["test_accuracy"], first["test_loss"])
    # the run records the GPU it trained on (fedsuite.records.provenance)
    (start,) = run.summary["provenance"]
    assert (start["device"], start["gpu"], start["cuda"]) == ("cuda", torch.cuda.get_device_name(), torch.version.cuda)


@pytest.mark.parametrize("name", sorted(methods()))
def test_method_trains_on_cuda(simulate, name):
    assert_trained_without_failures(simulate(strategy=name, **IN_PROCESS_ON_GPU))


@pytest.mark.parametrize("plugin", [{"relaxed_init.beta": 0.1}, {"neuron_lr.preset": "paper"}], ids=["relaxed_init", "neuron_lr"])
def test_plugins_train_on_cuda(simulate, plugin):
    assert_trained_without_failures(simulate(strategy="fedavg", **ON_GPU, **plugin))


def test_image_model_with_augmentation_on_cuda(simulate, tmp_path_factory):
    """uint8 images, the CNN, and crop-flip augmentation drawn from the CUDA generator."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("npz") / "images.npz"
    y = rng.integers(0, 10, 600)
    x = (rng.integers(0, 60, (600, 1, 28, 28)) + 19 * y[:, None, None, None]).astype(np.uint8)  # learnable
    np.savez(path, x_train=x[:500], y_train=y[:500], x_test=x[500:], y_test=y[500:])
    run = simulate(strategy="fedavg", dataset="npz", dataset_options={"path": str(path)}, model="cnn",
                   augment=True, **ON_GPU)
    assert_trained_without_failures(run)


def test_same_seed_same_metrics_on_cuda(simulate):
    a = simulate(strategy="fedavg", **ON_GPU)
    b = simulate(strategy="fedavg", **ON_GPU, run_name="again")
    assert a.run_dir != b.run_dir
    assert a.metrics_without_time() == b.metrics_without_time()
    for k in a.arrays:
        assert np.array_equal(a.arrays[k], b.arrays[k]), k


def test_engines_agree_on_cuda(simulate):
    """Flower's engine (a Ray actor given a quarter of the GPU) and the in-process engine train the
    same clients with the same seeds: the metrics and the final model must agree bit for bit."""
    flower = simulate(strategy="fedavg", **ON_GPU)
    inprocess = simulate(strategy="fedavg", **IN_PROCESS_ON_GPU)
    assert flower.metrics_without_time() == inprocess.metrics_without_time()
    for k in flower.arrays:
        assert np.array_equal(flower.arrays[k], inprocess.arrays[k]), k


def test_fedsuites_sgd_is_torch_optim_sgd_on_cuda():
    """On CUDA ``fedsuite.method.training.SGD`` takes torch's multi-tensor kernels, as ``torch.optim.SGD``
    does there: five steps with momentum and weight decay give the same parameters, bit for bit."""
    import copy

    from fedsuite.method.training import SGD

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.GroupNorm(2, 4), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 4 * 4, 5)).cuda()
    x, y = torch.randn(8, 3, 6, 6, device="cuda"), torch.randint(0, 5, (8,), device="cuda")
    ours, theirs = copy.deepcopy(net), copy.deepcopy(net)
    opt_ours = SGD(ours.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    for _ in range(5):
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))
