"""``fedsuite.engine.allocator``: with glibc's malloc thresholds fixed, a CPU evaluation loop stops
mapping fresh pages for every batch (counted as the process's minor page faults, not timed)."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
import textwrap

import pytest

from fedsuite.engine import allocator


def glibc() -> bool:
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError, TypeError):
        return False
    return True


#: a central evaluation's allocations, as ``fedsuite.method.training.evaluate`` makes them: a
#: uint8 batch to float, FedMR's CNN, the summed loss and the hits; 3 evaluations of 10 batches of
#: 256 after one to warm up; prints the minor page faults of those 3
EVALUATION_LOOP = textwrap.dedent("""
    import resource, sys
    import torch, torch.nn.functional as F
    from fedsuite.engine import allocator
    from fedsuite.models import cnn
    if sys.argv[1] == "tuned":
        assert allocator.tune()
    torch.set_num_threads(1)
    model = cnn(10, (1, 28, 28)).eval()
    x = torch.randint(0, 255, (2560, 1, 28, 28), dtype=torch.uint8)
    y = torch.randint(0, 10, (2560,))
    def evaluate():
        with torch.no_grad():
            for s in range(0, 2560, 256):
                logits = model((x[s:s + 256].float() / 255 - 0.5) / 0.5)
                F.cross_entropy(logits, y[s:s + 256], reduction="sum")
                (logits.argmax(1) == y[s:s + 256]).sum()
    evaluate()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        evaluate()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def page_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", EVALUATION_LOOP, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not glibc(), reason="the C library is not glibc: allocator.tune changes nothing there")
def test_fixed_thresholds_stop_the_evaluation_loop_mapping_pages_per_batch():
    default, tuned = page_faults("default"), page_faults("tuned")
    # 30 batches whose activations (9.4 MB a conv output) glibc by default maps and hands back
    # batch after batch (about 130,000 faults on the machine this was written on); fixed, the heap
    # keeps them: a few hundred to a few thousand faults for the whole loop (2,305 under a full test
    # run's load). How many the default takes is glibc's business: the tuned count must be a small
    # fraction of it where glibc maps per batch, and small wherever it does not
    assert tuned < max(default / 20, 5000), (default, tuned)


def test_tune_is_once_per_process_and_says_whether_it_took():
    first = allocator.tune()
    assert allocator.tune() is first
    assert first == glibc()


#: one in-process run in a fresh process, glibc's thresholds fixed (``tuned``) or left as glibc sets
#: them (``default``: the engine's call made a no-op); argv: mode, config values as JSON, run folder
ONE_RUN = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from fedsuite.config import build_config
    from fedsuite.engine import allocator
    from fedsuite.launch import start
    if sys.argv[1] == "default":
        allocator.tune = lambda: False
    outcome = start.simulate(build_config(values=json.loads(sys.argv[2])), Path(sys.argv[3]))
    assert outcome.ok, outcome.details
    assert allocator._result is (True if sys.argv[1] == "tuned" else None)
""")


@pytest.mark.skipif(not glibc(), reason="the C library is not glibc: allocator.tune changes nothing there")
def test_the_thresholds_change_no_number_of_a_run(tmp_path, data_root):
    """Where memory comes from moves no arithmetic: a run with the thresholds fixed and one with glibc's
    own give the same records and model, bit for bit."""
    import json

    import torch
    from conftest import FAST, assert_same_arrays

    from fedsuite.records.rows import read_metrics

    values = json.dumps({**FAST, "data_root": str(data_root), "engine": "inprocess", "rounds": 2})
    runs = {}
    for mode in ("default", "tuned"):
        done = subprocess.run([sys.executable, "-c", ONE_RUN, mode, values, str(tmp_path / mode)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        rows = [{k: v for k, v in r.items() if k != "wall_seconds"} for r in read_metrics(tmp_path / mode)]
        runs[mode] = rows, torch.load(tmp_path / mode / "checkpoint.pt", weights_only=False)["arrays"]
    assert runs["default"][0] == runs["tuned"][0]
    assert_same_arrays(runs["default"][1], runs["tuned"][1])
