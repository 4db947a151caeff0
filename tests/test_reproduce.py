"""``fedsuite reproduce`` (issue 13): tables as data, the resumable queue, the report.

* The tables files hold the specs' numbers: every published cell of every target is compared with
  the table parsed from ``../shared/specs/*.md`` (beside the repository root).
* Every cell of every target builds a valid config at both scales (no run).
* The report's maths (run value, mean ± std over seeds or pooled, ordering claims and their verdict
  from seed-paired differences weighed against the paper's difference: holds, reversed, could not
  tell, smaller than the paper's, inert here, not judged) on hand-made inputs; a row's
  ``paper_differences`` (the nearest published cell) and ``components`` (the component that
  distinguishes an ordering) parsed and refused when malformed; the report and claims.csv show the
  paper's difference and the component's recorded activity (or that none was recorded); the claims
  targets (issue 32) parse into the papers' headline orderings and plan seed by seed.
* Bad input: one line, exit code 2, nothing started (unknown target/row/method, missing data).
* The claims targets at paper scale (the papers' models and datasets), shrunk to 4 clients and one
  round, on generated CIFAR-10/100 in torchvision's format: the data check, the queue (two at a
  time) and the report, for one claim of FedMRUR's and FedNLR's; on a GPU (``-m gpu``) every cell
  of every claims target, two simulations sharing the GPU.
* End to end, real processes: a tiny target (the generated synthetic dataset, 2 methods x 2 seeds x
  2 rounds, on the in-process engine) is SIGKILLed as a process group while its second run is mid-way, then started again:
  the finished run is not touched, the killed one resumes, every round appears once, the report is
  complete, and the resumed run equals, bit for bit, the same cell run without interruption.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console

from fedsuite.records import hold, rundir
from fedsuite.launch.processes import available_cores, core_slices
from fedsuite.config import ConfigError, build_config
from fedsuite.queues.reproduce.queue import (ReproduceError, check_recorded, missing_data, name_failed, pending, placement_options,
                                      run_queue)
from fedsuite.queues.reproduce.report import aggregate, write_report
from fedsuite.queues.reproduce.planning import plan
from fedsuite.queues.reproduce.tables import SCALES, Target, load_targets, parse_tables
from fedsuite.method.activity import Component
from fedsuite.queues.reproduce.verdicts import (ACTIVITY_NOT_RECORDED, difference_over_rounds, COULD_NOT_TELL, HOLDS, INERT_HERE, NOT_JUDGED, REVERSED,
                                         SMALLER_THAN_PAPERS, VERDICTS, Activity, Claim, claims,
                                         paired_verdict, t_quantile, verdict, verdict_rule)
from fedsuite.records.results import run_value, write_atomically, write_json
from fedsuite.records.rows import read_metrics
from tests.conftest import FAST, assert_same_arrays, fedsuite_run, tree_snapshot
from tests.test_data import make_cifar10, make_cifar100

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT.parent / "shared" / "specs"


# ------------------------------------------------------------------------------------------------
# the tables files against the specs
# ------------------------------------------------------------------------------------------------


def spec_table(spec: str, heading: str, nth: int = 0) -> tuple[list[str], list[list[str]]]:
    """The ``nth`` Markdown table after the line containing ``heading`` in a spec: (header, rows)."""
    lines = (SPECS / spec).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if heading in line)
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if current:
            tables.append(current)
            current = []
        if len(tables) > nth or line.startswith("#"):
            break
    if current:
        tables.append(current)
    table = tables[nth]
    return table[0], table[2:]


def spec_cell(text: str) -> tuple[float, float | None]:
    """``"50.66 ± 1.18"``, ``"**74.11±0.48**"``, ``"78.77±.11"``, ``"70.65±.21†"``, ``"∞"``, ``"513"``."""
    text = re.sub(r"\(.*?\)", "", text.replace("**", "").replace("†", "")).strip()
    if text == "∞":
        return math.inf, None
    m = re.fullmatch(r"([\d.]+)\s*(?:±\s*\.?([\d.]+))?", text)
    assert m, f"unreadable spec cell {text!r}"
    std = m.group(2)
    if std is not None and "±." in text.replace(" ", ""):
        std = "0." + std
    return float(m.group(1)), None if std is None else float(std)


@pytest.fixture(scope="module")
def targets() -> dict[str, Target]:
    return load_targets()


def _published(targets, name: str) -> dict[str, dict[str, tuple[float, float | None]]]:
    return {row.name: row.published for row in targets[name].rows}


@pytest.mark.skipif(not SPECS.is_dir(), reason="../shared/specs is not present")
def test_every_spec_table_is_a_target(targets):
    assert sorted(targets) == sorted([
        "fedmr-table1", "fedmrur-table2", "fedmrur-table3", "fedmrur-table6",
        "fednlr-table1", "fednlr-table2", "fednlr-table3", "fedinit-table1", "fedinit-table2", "fedinit-table3",
        "fedmr-study",  # not a paper table: issue 14's study (no published cells)
        "fedmr-claims", "fedmrur-claims", "fednlr-claims", "fedinit-claims",  # the headline orderings (issue 32)
        "fedmr-claims-cifar10", "fednlr-claims-cifar10", "fedinit-claims-cifar10",  # and on CIFAR-10 (issue 39)
        "fedmrur-claims-cifar10"])
    # FedMR's spec: "This is the paper's only table"
    assert "only table" in (SPECS / "fedmr.md").read_text()


@pytest.mark.skipif(not SPECS.is_dir(), reason="../shared/specs is not present")
def test_fedmr_table1_matches_the_spec(targets):
    header, rows = spec_table("fedmr.md", "### 6.1 Table 1")
    methods = [h.lower() for h in header[3:]]
    pub = _published(targets, "fedmr-table1")
    assert len(rows) == len(pub) == 27
    for spec_row, (name, cells) in zip(rows, pub.items()):
        assert name.split("-")[-1] in (spec_row[2].lower(), "femnist")
        assert {m: spec_cell(c) for m, c in zip(methods, spec_row[3:])} == cells, name


@pytest.mark.skipif(not SPECS.is_dir(), reason="../shared/specs is not present")
def test_fedmrur_tables_match_the_spec(targets):
    names = {"FedAvg": "fedavg", "FedExp": "fedexp", "FedProx": "fedprox", "SCAFFOLD": "scaffold",
             "FedCM": "fedcm", "MoFedSAM": "mofedsam", "FedMRUR": "fedmrur", "Our": "fedmrur"}
    for target, heading in (("fedmrur-table2", "### Table 2:"), ("fedmrur-table6", "### Table 6 (appendix)")):
        header, rows = spec_table("fedmrur.md", heading)
        pub = list(_published(targets, target).values())
        assert len(pub) == len(header) - 1
        for j, cells in enumerate(pub):
            assert cells == {names[r[0]]: spec_cell(r[j + 1]) for r in rows}, (target, header[j + 1])
    # Table 3: rounds to target; a hand-picked sample, ∞ included
    t3 = _published(targets, "fedmrur-table3")
    assert t3["c100-dir0.6-38"]["fedavg"] == (513.0, None)
    assert t3["c100-path10-38"]["fedavg"] == (math.inf, None)
    assert t3["c100-path10-42"]["scaffold"] == (998.0, None)
    assert t3["tiny-path40-35"]["scaffold"] == (2064.0, None)
    assert t3["tiny-path40-40"]["fedcm"] == (2186.0, None)
    assert t3["tiny-dir0.3-40"]["fedmrur"] == (1050.0, None)
    assert len(t3) == 24
    text = (SPECS / "fedmrur.md").read_text()
    assert "| FedCM | 45% | 276 | 353 | 470 | 842 | 40% | 1451 | 2173 | 1587 | 2186 |" in text


@pytest.mark.skipif(not SPECS.is_dir(), reason="../shared/specs is not present")
def test_fednlr_tables_match_the_spec(targets):
    names = {"FedAvg": "fedavg", "FedProx": "fedprox", "Scaffold": "scaffold", "FedNova": "fednova",
             "FedRS": "fedrs", "FedLC": "fedlc", "CCVR": "ccvr", "FedDyn": "feddyn", "FedNLR": "fednlr",
             "FedDyn + FedNLR": "feddyn-nlr", "FedDyn+FedNLR": "feddyn-nlr"}
    t1 = list(_published(targets, "fednlr-table1").values())
    for half in (0, 1):  # Shards, then Dirichlet
        header, rows = spec_table("fednlr.md", "### Table 1:", half)
        for j in range(len(header) - 1):
            assert t1[8 * half + j] == {names[r[0]]: spec_cell(r[j + 1]) for r in rows}, header[j + 1]
    for target, heading in (("fednlr-table2", "### Table 2:"), ("fednlr-table3", "### Table 3:")):
        header, rows = spec_table("fednlr.md", heading)
        pub = list(_published(targets, target).values())
        for j, cells in enumerate(pub):
            assert cells == {names[r[0]]: spec_cell(r[j + 1]) for r in rows}, (target, header[j + 1])


@pytest.mark.skipif(not SPECS.is_dir(), reason="../shared/specs is not present")
def test_fedinit_tables_match_the_spec(targets):
    t1 = list(_published(targets, "fedinit-table1").values())
    for block in (0, 1):  # ResNet-18-GN, then VGG-11
        header, rows = spec_table("fedinit.md", "### Table 1 — test", block)
        for j in range(8):
            assert t1[8 * block + j] == {r[0].lower(): spec_cell(r[j + 1]) for r in rows}, header[j + 1]
    header, rows = spec_table("fedinit.md", "### Table 2 — RI")
    t2 = list(_published(targets, "fedinit-table2").values())
    for j, cells in enumerate(t2):
        for r in rows:
            m = r[0].rstrip("*").lower()
            assert cells[m] == spec_cell(r[1 + 2 * j]) and cells[m + "-ri"] == spec_cell(r[2 + 2 * j]), (m, j)
    header, rows = spec_table("fedinit.md", "### Table 3 — β")
    (t3,) = _published(targets, "fedinit-table3").values()
    assert t3 == {"beta" + b.replace("−", "-"): spec_cell(v) for b, v in zip(header[1:], rows[0][1:])}
    assert t3["beta0.15"] == (44.47, None) and t3["beta-0.2"] == (64.70, None)


def test_every_cell_builds_a_config(targets, tmp_path):
    """Each cell's config file + overrides validate at both scales; CPU scale uses MNIST-like data."""
    for target in targets.values():
        for scale in SCALES if target.has_cpu_scale else ("paper",):
            specs = plan(target, scale, tmp_path)
            assert specs, target.name
            if scale == "cpu":
                assert {s.dataset[0] for s in specs} <= {"fmnist", "mnist"}, target.name
    fedmr = plan(targets["fedmr-table1"], "cpu", tmp_path, rows=["cnn-c10-0.1"], seeds=[0])
    assert [s.method for s in fedmr] == list(targets["fedmr-table1"].methods)
    assert all(s.rounds == 20 for s in fedmr)
    # where runs execute is passed to every run, before --resume (the e2e test runs on a cluster)
    placed = fedmr[0].command(resume=True, placement=placement_options(0.25, "127.0.0.1:6379"))
    assert placed[-5:] == ["--num-gpus", "0.25", "--ray-address", "127.0.0.1:6379", "--resume"]
    assert "--ray-address" not in fedmr[0].command(resume=False, placement=placement_options(None, None))
    inprocess = fedmr[0].command(resume=False, placement=placement_options(None, None, "inprocess"))
    assert inprocess[-2:] == ["--engine", "inprocess"]
    with pytest.raises(ReproduceError, match="--ray-address goes with --engine flower"):
        placement_options(None, "127.0.0.1:6379", "inprocess")


#: the SAM radius of FedMRUR's CIFAR-10 claims cell: the largest of 0.5 (the paper's), 0.2, 0.1, 0.05
#: with which FedMRUR trained FedMR's CNN in a 30-round probe (experiments/fedmrur/README.md)
FEDMRUR_CIFAR10_RHO = 0.05


def test_the_cifar10_claims_targets_plan_the_papers_cells(targets, tmp_path):
    """Issue 39's CIFAR-10 targets: the papers' cells on CIFAR-10 at paper scale (FedMR's CNN where
    the paper's model does not fit, named in each note), 3 seeds, 500 rounds where the paper runs
    500, FedDyn in both weight-decay readings, FedMR's α = 0.1 cell at both momenta (the paper's
    0.9, the authors' code's 0.5, whose differences are the 0.9 cell's, named); no cpu scale."""
    def cells(name: str) -> dict[tuple[str, str], Any]:
        return {(s.row.name, s.method): build_config(s.config, s.overrides)
                for s in plan(targets[name], "paper", tmp_path, data_root=str(tmp_path))}

    fedmr = cells("fedmr-claims-cifar10")
    # FedMut at spec A27's alternative (α = 4, T_mut = 50) runs in its own row, beside the momentum-0.5
    # row's FedAvg and FedMR runs (one folder: those are planned once)
    assert sorted(fedmr) == sorted([*((row, m) for row in ("cnn-c10-0.1", "cnn-c10-0.1-m0.5")
                                      for m in ("fedavg", "fedmut", "fedmr")), ("cnn-c10-0.1-m0.5-a27", "fedmut-a4")])
    for (row, method), cfg in fedmr.items():  # the paper's CNN setting (spec §4), evaluated every 5 rounds
        momentum = 0.5 if "-m0.5" in row else 0.9
        assert (cfg.dataset, cfg.model, cfg.num_clients, cfg.cohort_size, cfg.local_epochs, cfg.batch_size,
                cfg.lr, cfg.momentum, cfg.rounds, cfg.eval_every) == ("cifar10", "cnn", 100, 10, 5, 50, 0.01, momentum,
                                                                      500, 5)
        assert cfg.alpha == float(row.split("-")[2]) and cfg.strategy == method.removesuffix("-a4")
        if cfg.strategy == "fedmut":  # spec A27: the FedMR repository's defaults, or the FedMut repository's
            assert (cfg.fedmut.radius, cfg.fedmut.mut_acc_rate, cfg.fedmut.mut_bound) == (
                (4.0, 0.3, 50) if method == "fedmut-a4" else (5.0, 0.3, 100))
    (alternative,) = [r for r in targets["fedmr-claims-cifar10"].rows if r.name == "cnn-c10-0.1-m0.5-a27"]
    assert alternative.setting == "claims-cnn-c10-0.1-m0.5" and alternative.claims == [
        ("fedmr", "fedmut-a4"), ("fedmut-a4", "fedavg")]
    assert {pair: value for pair, (value, _) in alternative.paper_differences.items()} == pytest.approx(
        {("fedmr", "fedmut-a4"): 54.63 - 52.88, ("fedmut-a4", "fedavg"): 52.88 - 50.66})
    (at_half,) = [r for r in targets["fedmr-claims-cifar10"].rows if r.name == "cnn-c10-0.1-m0.5"]
    assert {pair: value for pair, (value, _) in at_half.paper_differences.items()} == pytest.approx(
        {("fedmr", "fedavg"): 54.63 - 50.66, ("fedmr", "fedmut"): 54.63 - 52.88, ("fedmut", "fedavg"): 52.88 - 50.66})
    assert fedmr["cnn-c10-0.1", "fedmr"].fedmr.first_stage_rounds == 0
    target = targets["fedmr-claims-cifar10"]
    assert target.last * 5 == 95 and target.seeds == [1, 2, 3]  # rounds 410-500, as spec A8's last 10 every 10
    fednlr = cells("fednlr-claims-cifar10")
    assert {m: (c.rounds, c.weight_decay, c.strategy) for (_, m), c in fednlr.items()} == {
        "fedavg": (500, 0.0, "fedavg"), "fednlr": (500, 0.0, "fednlr"),
        "feddyn": (200, 0.1, "feddyn"), "feddyn-nlr": (200, 0.1, "feddyn"),
        "feddyn-wd1e-3": (200, 0.001, "feddyn"), "feddyn-nlr-wd1e-3": (200, 0.001, "feddyn")}
    for cfg in fednlr.values():  # Table 1's Dir(20, 0.3) cell and local recipe
        assert (cfg.num_clients, cfg.cohort_size, cfg.alpha, cfg.local_epochs, cfg.batch_size, cfg.lr,
                cfg.model, cfg.eval_every) == (20, 8, 0.3, 2, 64, 0.01, "cnn", 1)
    assert [m for (_, m), c in fednlr.items() if c.plugin_settings.get("neuron_lr") is not None] == [
        "fednlr", "feddyn-nlr", "feddyn-nlr-wd1e-3"]
    fedinit = cells("fedinit-claims-cifar10")
    for (_, method), cfg in fedinit.items():  # Dir-0.1, the paper's 5 local epochs and recipe
        assert (cfg.partitioner, cfg.alpha, cfg.local_epochs, cfg.lr, cfg.lr_decay, cfg.weight_decay, cfg.rounds,
                cfg.model) == ("dirichlet-refill", 0.1, 5, 0.1, 0.998, 0.001, 500, "cnn")
    assert {m for (_, m), c in fedinit.items() if c.plugin_settings.get("relaxed_init") is not None} == {
        "fedinit", "scaffold-ri"}
    fedmrur = cells("fedmrur-claims-cifar10")
    assert sorted(m for _, m in fedmrur) == ["fedavg", "fedmrur", "fedmrur-mean", "fedmrur-n", "fedmrur-n-mean",
                                             "mofedsam"]
    for cfg in fedmrur.values():  # Table 6's Dir 0.3 column, the paper's clients, local epochs and recipe
        assert (cfg.partitioner, cfg.alpha, cfg.num_clients, cfg.cohort_size, cfg.local_epochs, cfg.batch_size,
                cfg.lr, cfg.lr_decay, cfg.weight_decay, cfg.model, cfg.rounds, cfg.eval_every) == \
            ("dirichlet-equal", 0.3, 200, 10, 3, 50, 0.1, 0.998, 5e-4, "cnn", 500, 5)
        if cfg.strategy != "fedavg":  # the SAM radius: the largest that trained (the target's note)
            assert getattr(cfg, cfg.strategy).rho == FEDMRUR_CIFAR10_RHO
    assert [m for (_, m), c in fedmrur.items() if c.strategy == "fedmrur" and not c.fedmrur.hyperbolic] == [
        "fedmrur-n", "fedmrur-n-mean"]
    # both readings of Algorithm 1's momentum: m from the normalised update (the default) or the plain mean
    assert {m: c.fedmrur.momentum_source for (_, m), c in fedmrur.items() if c.strategy == "fedmrur"} == {
        "fedmrur-n": "normalized", "fedmrur": "normalized", "fedmrur-n-mean": "mean", "fedmrur-mean": "mean"}
    (row,) = targets["fedmrur-claims-cifar10"].rows
    assert {pair: value for pair, (value, _) in row.paper_differences.items()} == pytest.approx(
        {("fedmrur", "fedmrur-n"): 55.49 - 54.27,  # Table 4's: Table 6 has no FedMRUR-N
         ("fedmrur-mean", "fedmrur-n-mean"): 55.49 - 54.27})
    assert row.claims[4:] == [("fedmrur-mean", "mofedsam"), ("fedmrur-mean", "fedavg"),
                              ("fedmrur-mean", "fedmrur-n-mean")]
    for name in ("fedmr-claims-cifar10", "fednlr-claims-cifar10", "fedinit-claims-cifar10", "fedmrur-claims-cifar10"):
        assert "CIFAR-10 (JPEG copy)" in " ".join(r.label for r in targets[name].rows)
        # FedMR's cell trains the paper's own CNN (compared number to number); the others FedMR's CNN
        # in place of the paper's model (orderings only)
        assert {bool(r.model_deviation) for r in targets[name].rows} == {name != "fedmr-claims-cifar10"}
        with pytest.raises(ReproduceError, match="has no cpu scale"):
            plan(targets[name], "cpu", tmp_path)


def test_a_row_runs_only_the_methods_it_names(targets, tmp_path):
    """The study's FedMR-only rows (a FedMR option changes nothing for FedAvg) plan FedMR alone; the
    others plan every method; a row naming an unknown method is refused, naming it."""
    study = targets["fedmr-study"]
    specs = plan(study, "cpu", tmp_path)
    by_row: dict[str, list[str]] = {}
    for s in specs:
        by_row.setdefault(s.row.name, []).append(s.method)
    assert by_row["paper"] == ["fedavg", "fedmr"] and by_row["segments"] == ["fedmr"]
    assert by_row["two-stage"] == ["fedmr"] and by_row["authors-setting"] == ["fedmr"]
    authors = next(s for s in specs if s.row.name == "authors-setting")
    assert authors.rounds == 120 and "local_epochs=5" in authors.overrides and "momentum=0.5" in authors.overrides
    assert all(s.rounds == 200 for s in specs if s.row.name != "authors-setting")
    bad = tmp_path / "tables.toml"
    bad.write_text('[targets.t]\nours = "a"\n[targets.t.methods]\na = {}\n'
                   '[[targets.t.rows]]\nname = "r"\nmethods = ["a", "nope"]\n')
    with pytest.raises(ReproduceError, match="nope"):
        parse_tables(bad)


# ------------------------------------------------------------------------------------------------
# the report's maths
# ------------------------------------------------------------------------------------------------


def test_run_value_reads_the_last_evaluations_and_rounds_to_target():
    evals = [(1, 0.10), (2, 0.40), (3, 0.50), (4, 0.70)]
    value, tail = run_value(evals, "accuracy", last=2)
    assert value == pytest.approx(60.0) and tail == pytest.approx([50.0, 70.0])
    assert run_value(evals, "accuracy", last=10)[0] == pytest.approx(42.5)
    assert run_value(evals, "rounds", target_accuracy=50)[0] == 3.0
    assert run_value(evals, "rounds", target_accuracy=71)[0] == math.inf


def test_aggregate_over_seeds_and_pooled():
    """Every spread is the sample std (n − 1 in the denominator), not numpy's default population std."""
    assert aggregate([60.0, 62.0, 64.0]) == (pytest.approx(62.0), pytest.approx(2.0))  # sqrt(8 / 2)
    assert aggregate([60.0]) == (60.0, None)  # one seed: no spread over seeds
    assert aggregate([]) == (None, None)
    # pooled: FedMR/FedNLR's ± over the last evaluations of all seeds
    mean, std = aggregate([61.0, 63.0], [[60.0, 62.0], [62.0, 64.0]], spread="pooled")
    assert mean == pytest.approx(62.0) and std == pytest.approx(math.sqrt(8 / 3))
    # rounds to target: mean over the seeds that reach it; none reached = inf
    assert aggregate([100.0, 120.0, math.inf], metric="rounds") == (pytest.approx(110.0), pytest.approx(math.sqrt(200)))
    assert aggregate([math.inf, math.inf], metric="rounds") == (math.inf, None)


def test_t_quantile_is_students_two_sided_critical_value():
    """t_{(1+c)/2, n−1}: 12.71 for 2 seeds, 4.30 for 3 and 2.78 for 5 at 95%; 1.89 for 3 at 80%."""
    assert t_quantile(0.95, 2) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.95, 3) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.95, 5) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.80, 3) == pytest.approx(1.8856, abs=1e-4)
    with pytest.raises(ValueError, match="at least two"):
        t_quantile(0.95, 1)
    for bad in (0.0, 1.0, 95.0, -0.5, math.nan):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            t_quantile(bad, 3)


def test_paired_verdict_decides_with_the_t_interval_at_its_confidence():
    """d̄ = mean of the per-seed differences, SE = sample sd / √n, h = t_{(1+c)/2, n−1}·SE, I = d̄ ± h,
    D = the paper's difference: holds if I lies above 0, reversed if below; otherwise could not tell if
    D ≤ d̄ + h, smaller than the paper's if D > d̄ + h; not judged with fewer than two pairs."""
    # 3 seeds with d̄/SE = 3 (d = √3 + [−1, 0, 1]: sd 1, SE 1/√3): not holds at 95% (t = 4.30), holds at 80% (1.89)
    third = [math.sqrt(3) - 1, math.sqrt(3), math.sqrt(3) + 1]
    r95 = paired_verdict(third, paper_difference=1.0)
    assert r95.mean == pytest.approx(math.sqrt(3)) and r95.se == pytest.approx(1 / math.sqrt(3))
    assert r95.mean / r95.se == pytest.approx(3.0)
    assert r95.half_width == pytest.approx(t_quantile(0.95, 3) / math.sqrt(3)) and r95.verdict == COULD_NOT_TELL
    assert paired_verdict(third, paper_difference=1.0, confidence=0.80).verdict == HOLDS
    assert paired_verdict([-x for x in third], paper_difference=1.0, confidence=0.80).verdict == REVERSED
    assert paired_verdict([-x for x in third], paper_difference=1.0).verdict == SMALLER_THAN_PAPERS
    # beyond the interval in the paper's direction the paper's difference does not matter: holds even if far smaller
    tight = [2.0, 2.1, 2.2]  # d̄ 2.1, SE 0.0577, h 0.248
    assert paired_verdict(tight, paper_difference=0.01).verdict == HOLDS
    assert paired_verdict(tight, paper_difference=100.0).verdict == HOLDS
    assert paired_verdict([-x for x in tight], paper_difference=100.0).verdict == REVERSED
    # zero inside the interval: D inside it or above it; D inside below d̄ cannot be told from zero either
    wide = [1.0, 2.0, 3.0]  # d̄ 2, h = 4.30/√3 = 2.48: I = [−0.48, 4.48]
    assert paired_verdict(wide, paper_difference=4.0).verdict == COULD_NOT_TELL
    assert paired_verdict(wide, paper_difference=4.5).verdict == SMALLER_THAN_PAPERS
    assert paired_verdict(wide, paper_difference=0.5).verdict == COULD_NOT_TELL
    # the bounds are closed: [0, 2] has d̄ = 1, SE = 1, h = 12.71; D = d̄ + h exactly is inside
    edge = 1.0 + t_quantile(0.95, 2)
    assert paired_verdict([0.0, 2.0], paper_difference=edge) == (1.0, 1.0, pytest.approx(edge - 1.0), COULD_NOT_TELL)
    assert paired_verdict([0.0, 2.0], paper_difference=edge + 1e-6).verdict == SMALLER_THAN_PAPERS
    # d̄ = h exactly is not beyond zero (d = [a − b, a + b] has d̄ = a, SE = b): zero is on the interval's edge
    h2 = t_quantile(0.95, 2)
    assert paired_verdict([h2 - 1.0, h2 + 1.0], paper_difference=1.0).verdict == COULD_NOT_TELL
    assert paired_verdict([h2 - 0.99, h2 + 1.01], paper_difference=1.0).verdict == HOLDS
    # identical differences have SE 0, the interval is the point d̄: any non-zero mean is beyond zero; a
    # zero mean rules out every paper's difference (D > 0)
    assert paired_verdict([0.5, 0.5, 0.5], paper_difference=3.0) == (0.5, 0.0, 0.0, HOLDS)
    assert paired_verdict([-0.5, -0.5], paper_difference=3.0) == (-0.5, 0.0, 0.0, REVERSED)
    assert paired_verdict([0.0, 0.0], paper_difference=1e-6) == (0.0, 0.0, 0.0, SMALLER_THAN_PAPERS)
    # fewer than two pairs: no standard error, no verdict, whatever the paper's difference
    assert paired_verdict([3.0], paper_difference=1.0) == (3.0, None, None, NOT_JUDGED)
    assert paired_verdict([], paper_difference=1.0) == (None, None, None, NOT_JUDGED)
    # a paper's difference of +∞ (a rounds table's "never reached") is above every interval
    assert paired_verdict([0.0, 10.0], paper_difference=math.inf).verdict == SMALLER_THAN_PAPERS
    # the paper's difference is in the paper's direction, so it is > 0; the confidence a probability
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="must be > 0"):
            paired_verdict([1.0, 2.0], paper_difference=bad)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        paired_verdict([1.0, 2.0], paper_difference=1.0, confidence=95)
    assert VERDICTS == (HOLDS, REVERSED, COULD_NOT_TELL, SMALLER_THAN_PAPERS, INERT_HERE, NOT_JUDGED)
    rule = verdict_rule()
    assert "at 95% confidence" in rule and "0.975 quantile of Student's t with n − 1 degrees of freedom" in rule
    assert "D ≤ d̄ + h" in rule and "D > d̄ + h" in rule and "smallest difference these seeds could detect" in rule
    assert "**inert here**" in rule and "**activity not recorded**" in rule
    assert "at 80% confidence" in verdict_rule(0.8) and "0.9 quantile" in verdict_rule(0.8)


def test_inert_here_replaces_the_judgement_where_the_component_did_not_act():
    """activity = (a, θ): a < θ gives **inert here** whatever the differences (d̄ and SE still
    given), also with one paired seed; a ≥ θ, or no activity, gives the judgement as before."""
    se = math.sqrt(1 / 3)
    assert paired_verdict([1.0, 2.0, 3.0], 0.01, activity=(5e-7, 1e-3)) == \
        (2.0, pytest.approx(se), pytest.approx(t_quantile(0.95, 3) * se), INERT_HERE)
    assert paired_verdict([2.0, 2.1, 2.2], 0.01, activity=(1e-3, 1e-3)).verdict == HOLDS  # not below: judged
    assert paired_verdict([2.0, 2.1, 2.2], 0.01, activity=(0.2, 1e-3)).verdict == HOLDS
    assert paired_verdict([-1.0, -2.0, -3.0], 10.0, activity=(0.0, 1e-4)).verdict == INERT_HERE
    assert paired_verdict([3.0], 1.0, activity=(0.0, 1e-3)) == (3.0, None, None, INERT_HERE)
    assert paired_verdict([], 1.0, activity=(0.0, 1e-3)) == (None, None, None, NOT_JUDGED)  # nothing ran


SHARE = Component("fedmrur.hyperbolic", "fedmrur-hyperbolic-share", 1e-3, "‖∇(γR)‖ / ‖∇CE‖")


def test_the_claims_variants_are_their_papers_cells_but_for_what_they_name(targets, tmp_path):
    """The CIFAR-10 claims variants (targets of their own, read by a paper's pinned commit through
    ``--tables``): FedMRUR's cell at the paper's 1600 rounds is the 500-round cell's runs, config for
    config, but for the rounds and the seeds 3 and 4 of the two orderings three seeds did not decide;
    FedMR's Dir α = 0.5 cell is the α = 0.1 cell's setting but for α, at both momenta, with FedMut in
    both of spec A27's readings and Table 1's published numbers."""
    def cells(target: Target, seeds=None) -> dict[tuple[str, str, int], Any]:
        return {(s.row.name, s.method, s.seed): build_config(s.config, s.overrides)
                for s in plan(target, "paper", tmp_path, seeds=seeds, data_root=str(tmp_path))}

    experiments = ROOT / "experiments"
    longer = load_targets([experiments / "fedmrur" / "claims-cifar10-1600.toml"])["fedmrur-claims-cifar10-1600"]
    assert longer.seeds == [0, 1, 2, 3, 4]
    at_500 = cells(targets["fedmrur-claims-cifar10"])
    at_1600 = cells(longer, seeds=[0, 1, 2])
    assert at_1600.keys() == at_500.keys()
    for key, cfg in at_1600.items():
        assert cfg.rounds == 1600 and at_500[key].rounds == 500
        assert cfg.model_dump(exclude={"rounds"}) == at_500[key].model_dump(exclude={"rounds"}), key
    (row_1600,), (row_500,) = longer.rows, targets["fedmrur-claims-cifar10"].rows
    assert (row_1600.claims, row_1600.published, row_1600.paper_differences) == (
        row_500.claims, row_500.published, row_500.paper_differences)

    wider = load_targets([experiments / "fedmr" / "claims-cifar10-alpha0.5.toml"])["fedmr-claims-cifar10-alpha0.5"]
    narrow = cells(targets["fedmr-claims-cifar10"])
    for (row, method, seed), cfg in cells(wider).items():
        momentum = "-m0.5" if row.endswith("-m0.5") else ""
        like = narrow["cnn-c10-0.1" + momentum, method, seed] if method != "fedmut-a4" else \
            narrow["cnn-c10-0.1-m0.5-a27", method, seed]
        assert cfg.alpha == 0.5 and like.alpha == 0.1
        differ = {"alpha", "momentum", "output_dir"}  # the setting's folder: claims-cnn-c10-0.5[-m0.5]
        assert cfg.model_dump(exclude=differ) == like.model_dump(exclude=differ)
        assert cfg.output_dir.endswith(f"/claims-cnn-c10-0.5{momentum}")
        assert cfg.momentum == (0.5 if momentum else 0.9)
    assert sorted(r.name for r in wider.rows) == ["cnn-c10-0.5", "cnn-c10-0.5-m0.5"] and wider.seeds == [1, 2, 3]
    paper_row, at_half = wider.rows
    assert {m: v for m, (v, _) in paper_row.published.items()} == {  # Table 1, CNN / CIFAR-10 / α = 0.5
        "fedavg": 54.42, "fedmut": 57.29, "fedmut-a4": 57.29, "fedmr": 59.81}
    assert at_half.claims == paper_row.claims and not at_half.published
    assert {pair: value for pair, (value, _) in at_half.paper_differences.items()} == pytest.approx(
        {("fedmr", "fedavg"): 59.81 - 54.42, ("fedmr", "fedmut"): 59.81 - 57.29, ("fedmut", "fedavg"): 57.29 - 54.42,
         ("fedmr", "fedmut-a4"): 59.81 - 57.29, ("fedmut-a4", "fedavg"): 57.29 - 54.42})


def test_a_claims_activity_is_the_better_methods_mean_over_the_paired_seeds():
    """The better method's recorded activity (each run's mean over rounds) is averaged over the
    seeds paired for the ordering; a paired seed whose run recorded none makes it "activity not
    recorded", and the ordering is judged as before; an unnamed ordering has no activity."""
    obtained = {"ours": {0: 60.0, 1: 61.0, 2: 62.0}, "ablated": {0: 59.0, 1: 60.0, 2: 61.0}, "other": {0: 50.0, 1: 50.5}}
    published = {"ours": 55.0, "ablated": 54.0, "other": 40.0}
    recorded = {"ours": {0: {"fedmrur.hyperbolic": 4e-7}, 1: {"fedmrur.hyperbolic": 6e-7}, 2: {"fedmrur.hyperbolic": 2e-6}}}
    stated = [("ours", "ablated"), ("ours", "other")]
    named = {("ours", "ablated"): SHARE}
    inert, other = claims(published, obtained, [], stated=stated, components=named, activity=recorded)
    assert inert.activity.per_seed == {0: 4e-7, 1: 6e-7, 2: 2e-6}
    assert inert.activity.value == pytest.approx(1e-6) and inert.activity.inert
    assert inert.verdict == INERT_HERE and inert.result[:2] == (pytest.approx(1.0), 0.0)
    assert inert.activity.describe() == "fedmrur-hyperbolic-share 1e-06 < 0.001 (inert)"
    assert other.activity is None and other.verdict == HOLDS
    assert verdict([inert, other]) == "1 holds, 1 inert here"
    # acting: judged (d̄ = 1, SE = 0: holds), the value shown
    acting = {"ours": {s: {"fedmrur.hyperbolic": 0.05} for s in (0, 1, 2)}}
    (c,) = claims(published, obtained, [], stated=stated[:1], components=named, activity=acting)
    assert c.verdict == HOLDS and not c.activity.inert and c.activity.describe() == "fedmrur-hyperbolic-share 0.05 ≥ 0.001"
    # runs recorded before activity was measured: not recorded, judged as before
    (c,) = claims(published, obtained, [], stated=stated[:1], components=named, activity={})
    assert c.verdict == HOLDS and c.activity.value is None and c.activity.describe() == ACTIVITY_NOT_RECORDED
    partly = {"ours": {0: {"fedmrur.hyperbolic": 0.0}, 2: {"fedmrur.hyperbolic": 0.0}}}
    (c,) = claims(published, obtained, [], stated=stated[:1], components=named, activity=partly)
    assert c.verdict == HOLDS and c.activity.unrecorded == [1]
    assert c.activity.describe() == "activity not recorded (seed 1)"
    # a run that records other components only has not recorded this one
    (c,) = claims(published, obtained, [], stated=stated[:1], components=named,
                  activity={"ours": {s: {"neuron_lr": 0.0} for s in (0, 1, 2)}})
    assert c.verdict == HOLDS and c.activity.describe() == ACTIVITY_NOT_RECORDED
    assert Activity(SHARE).describe() == "-" and Activity(SHARE).value is None


def test_claims_pair_runs_by_seed_and_leave_out_failed_runs():
    """A claim's differences are taken seed by seed over the seeds where both runs completed (a
    failed or missing run drops its seed from that claim only); the direction is the paper's, and
    the paper's difference is that of its published numbers."""
    published = {"ours": 60.0, "a": 57.0, "b": 59.5, "c": 50.0}
    obtained = {"ours": {0: 60.0, 1: 62.0, 2: 61.0}, "a": {0: 58.0, 1: 59.0, 2: 60.5}, "b": {0: 61.0, 2: 60.0}}
    got = claims(published, obtained, [], stated=[("ours", "a"), ("ours", "b"), ("ours", "c")])
    assert got[0] == Claim("ours", "a", 3.0, {0: 2.0, 1: 3.0, 2: 0.5})
    # sd² = 19/12, SE = √(19/36) = 0.73, h = 4.30 SE = 3.13: I = [−1.29, 4.96] holds zero and the paper's 3
    se = math.sqrt(19 / 36)
    assert got[0].result == (pytest.approx(11 / 6), pytest.approx(se), pytest.approx(t_quantile(0.95, 3) * se),
                             COULD_NOT_TELL)
    assert got[0].confidence == 0.95
    assert claims(published, obtained, [], stated=[("ours", "a")], confidence=0.7)[0].verdict == HOLDS  # h = 1.06
    # seed 1 of b failed; d = [−1, 1]: I = [−12.7, 12.7] holds the paper's 0.5
    assert got[1] == Claim("ours", "b", 0.5, {0: -1.0, 2: 1.0}) and got[1].verdict == COULD_NOT_TELL
    assert got[2] == Claim("ours", "c", 10.0, {}) and got[2].verdict == NOT_JUDGED  # c never completed
    assert verdict(got) == "2 could not tell, 1 not judged"
    # the paper's 15 lies above the interval of b's pairs: smaller than the paper's
    got = claims({"ours": 60.0, "b": 45.0}, obtained, [], stated=[("ours", "b")])
    assert got[0].verdict == SMALLER_THAN_PAPERS
    pair = {0: 1.0, 1: 1.0}
    assert verdict([Claim("x", "y", 1.0, pair), Claim("x", "z", 1.0, pair)]) == "2 hold"
    assert verdict([Claim("x", "y", 9.0, {0: 0.0, 1: 1.0}), Claim("x", "z", 14.0, {0: -1.0, 1: 1.0}),
                    Claim("y", "z", 9.0, {0: -2.0, 1: -2.0})]) == "1 reversed, 2 smaller than the paper's"
    assert verdict([]) == "no claim"


def test_a_claim_not_published_takes_the_nearest_cells_difference():
    """A stated claim whose methods are not both published in its row takes the paper's difference
    from the nearest cell the row names, with its source; without one it is refused."""
    obtained = {"ours": {0: 60.0, 1: 61.0}, "twostage": {0: 60.5, 1: 61.5}, "a": {0: 60.0, 1: 60.0}}
    nearest = {("twostage", "a"): (3.97, "Table 1, CNN / CIFAR-10 / 0.1, one stage")}
    got = claims({"ours": 54.63, "a": 50.66}, obtained, [], stated=[("ours", "a"), ("twostage", "a")],
                 nearest=nearest)
    assert got[0].paper_difference == pytest.approx(3.97) and got[0].paper_source == ""
    assert got[1] == Claim("twostage", "a", 3.97, {0: 0.5, 1: 1.5}, "Table 1, CNN / CIFAR-10 / 0.1, one stage")
    # d = [0.5, 1.5]: d̄ = 1, SE = 0.5, h = 12.71 · 0.5: I = [−5.35, 7.35] holds zero and 3.97
    assert got[1].result == (1.0, 0.5, pytest.approx(t_quantile(0.95, 2) * 0.5), COULD_NOT_TELL)
    with pytest.raises(ValueError, match="the claim twostage > a has no paper's difference"):
        claims({"a": 50.66}, obtained, [], stated=[("twostage", "a")])


def test_claims_follow_the_published_order():
    """Without stated claims, a row's orderings are read off its published numbers (ties make none)."""
    published = {"ours": 55.0, "a": 50.0, "b": 57.0, "c": 55.0}
    obtained = {"ours": {0: 60.0, 1: 61.0}, "a": {0: 58.0, 1: 58.5}, "b": {0: 61.0, 1: 63.0}, "c": {0: 59.0}}
    got = claims(published, obtained, [("ours", "a"), ("ours", "b"), ("ours", "c")])
    # b beat ours in the paper: the claim is "b > ours", its differences are b − ours, the paper's 2
    assert got == [Claim("ours", "a", 5.0, {0: 2.0, 1: 2.5}), Claim("b", "ours", 2.0, {0: 1.0, 1: 2.0})]


def test_a_rounds_table_judges_rounds_saved():
    """Rounds to target: lower is better, so every difference is worse − better (rounds saved), the
    paper's too (∞ where the worse method never reached the target)."""
    obtained = {"ours": {0: 12.0, 1: 14.0, 2: 13.0}, "x": {0: 30.0, 1: 27.0, 2: 28.0}, "y": {0: 20.0, 1: 6.0, 2: 13.0}}
    got = claims({"ours": 200.0, "x": math.inf, "y": 250.0}, obtained, [("ours", "x"), ("ours", "y")],
                 higher_is_better=False)
    assert got == [Claim("ours", "x", math.inf, {0: 18.0, 1: 13.0, 2: 15.0}),
                   Claim("ours", "y", 50.0, {0: 8.0, 1: -8.0, 2: 0.0})]
    assert got[0].verdict == HOLDS  # d̄ = 15.33, SE = 1.45, h = 6.25
    # d̄ = 0, SE = 8/√3: I = ±19.9 rounds; the paper's 50 saved lie above it
    se = 8 / math.sqrt(3)
    assert got[1].result == (0.0, pytest.approx(se), pytest.approx(t_quantile(0.95, 3) * se), SMALLER_THAN_PAPERS)
    # the paper saving 9 rounds lies inside the interval: could not tell
    assert claims({"ours": 200.0, "y": 209.0}, obtained, [("ours", "y")], higher_is_better=False)[0].verdict \
        == COULD_NOT_TELL
    # a published ordering the other way is the claim "y > ours", its saving positive
    (flipped,) = claims({"ours": 209.0, "y": 200.0}, obtained, [("ours", "y")], higher_is_better=False)
    assert (flipped.better, flipped.worse, flipped.paper_difference) == ("y", "ours", 9.0)


def test_the_claims_run_records_are_not_ignored_by_git():
    """``experiments/claims.sh cpu`` keeps finished runs across machines by committing their records
    under ``experiments/<paper>/results/claims-cpu/runs``; a ``.gitignore`` rule (``runs/``) once hid
    them, so records said to be committed never were. A run's default output, ``/runs``, stays ignored."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to commit records to")
    record = "experiments/fedmrur/results/claims-cpu/runs/c100-dir0.3/fedavg-s0/metrics.jsonl"

    def ignored(path: str) -> bool:
        res = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, capture_output=True, text=True)
        assert res.returncode in (0, 1), res.stderr
        return res.returncode == 0

    assert not ignored(record), record
    assert ignored("runs/my-run/metrics.jsonl")


def test_a_report_file_is_replaced_whole_or_not_at_all(tmp_path):
    """Two ``reproduce`` processes of one target (different seeds, as ``experiments/claims.sh cpu``'s
    two workers) may write its report at the same moment: each file is written beside and renamed
    over the old one (``results.write_atomically``). A write that fails leaves the old file and no
    temporary one."""
    path = tmp_path / "report.csv"
    path.write_text("old\n")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half_then_fail)
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]
    seen = []
    write_atomically(path, lambda tmp: (seen.append(tmp), tmp.write_text("new\n")))
    assert seen[0].parent == tmp_path and seen[0].suffix == ".csv" and seen[0] != path
    assert path.read_text() == "new\n" and list(tmp_path.iterdir()) == [path]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain write: readable by others


def test_the_claims_targets_hold_each_papers_headline_orderings(targets, tmp_path):
    """Issue 32's orderings, one target per paper; at CPU scale every cell runs at least 200 rounds
    (FedNLR's FedAvg and FedNLR the paper's 500: FedAvg had not flattened at 200), evaluated every 5,
    on 100 clients with 10 per round, over seeds 0, 1, 2, planned seed by seed."""
    expected = {
        "fedmrur-claims": {"c100-dir0.3": [("fedmrur", "mofedsam"), ("mofedsam", "fedavg"), ("fedmrur", "fedavg"),
                                           ("fedmrur", "fedmrur-n")]},
        "fednlr-claims": {"c10n100-dir0.1": [("fednlr", "fedavg"), ("feddyn-nlr", "feddyn"),
                                             ("feddyn-nlr-wd1e-3", "feddyn-wd1e-3")]},
        "fedinit-claims": {"r18-c10-100-dir0.1": [("fedinit", "fedavg"), ("scaffold-ri", "scaffold")]},
        "fedmr-claims": {"paper": [("fedmr", "fedavg"), ("fedmr-2stage", "fedavg")],
                         "momentum-0.5": [("fedmr", "fedavg")]},
    }
    for name, rows in expected.items():
        target = targets[name]
        assert {r.name: r.claims for r in target.rows} == rows, name
        specs = plan(target, "cpu", tmp_path, data_root=str(tmp_path / "data"))
        assert [s.seed for s in specs] == sorted(s.seed for s in specs), "seed-major order"
        assert {s.seed for s in specs} == {0, 1, 2}, name
        for s in specs:
            cfg = build_config(s.config, s.overrides)
            rounds = 500 if (name, s.method) in {("fednlr-claims", "fedavg"), ("fednlr-claims", "fednlr")} else 200
            assert (cfg.rounds, cfg.eval_every, cfg.num_clients, cfg.cohort_size, cfg.dataset) == \
                (rounds, 5, 100, 10, "fmnist"), s.label
    cfg = lambda s: build_config(s.config, s.overrides)  # noqa: E731
    # FedDyn in both readings of the paper's "weight decay of 0.1" (issue 39): on top of α, and the lineage's 1e-3
    cells = {s.method: cfg(s) for s in plan(targets["fednlr-claims"], "cpu", tmp_path, seeds=[0])}
    assert {m: (c.weight_decay, c.feddyn.alpha, c.neuron_lr.preset) for m, c in cells.items() if "feddyn" in m} == {
        "feddyn": (0.1, 0.1, None), "feddyn-nlr": (0.1, 0.1, "paper_main"),
        "feddyn-wd1e-3": (0.001, 0.1, None), "feddyn-nlr-wd1e-3": (0.001, 0.1, "paper_main")}
    cells = {(s.row.name, s.method): s for s in plan(targets["fedmrur-claims"], "cpu", tmp_path, seeds=[0])}
    assert cfg(cells["c100-dir0.3", "fedmrur-n"]).fedmrur.hyperbolic is False
    assert cfg(cells["c100-dir0.3", "fedmrur"]).fedmrur.hyperbolic is True
    assert {cfg(s).alpha for s in cells.values()} == {0.3}
    cells = {(s.row.name, s.method): s for s in plan(targets["fedmr-claims"], "cpu", tmp_path, seeds=[0])}
    # FedMR-n aggregates for 20% of the rounds: 40 of 200 at CPU scale (cpu_method_set), 100 of 500 at paper scale
    assert cfg(cells["paper", "fedmr-2stage"]).fedmr.first_stage_rounds == 40
    assert cfg(cells["paper", "fedmr"]).fedmr.first_stage_rounds == 0
    paper = {(s.row.name, s.method): s for s in plan(targets["fedmr-claims"], "paper", tmp_path, seeds=[1])}
    assert cfg(paper["paper", "fedmr-2stage"]).fedmr.first_stage_rounds == 100
    assert cfg(cells["momentum-0.5", "fedmr"]).momentum == 0.5 and cfg(cells["paper", "fedavg"]).momentum == 0.9
    # the rows the claims target shares with the study are the same cells, so they share runs
    study = {(s.row.name, s.method): s for s in plan(targets["fedmr-study"], "cpu", tmp_path, seeds=[0])}
    for key in (("paper", "fedavg"), ("paper", "fedmr"), ("momentum-0.5", "fedavg"), ("momentum-0.5", "fedmr")):
        assert study[key].run_dir == cells[key].run_dir and study[key].overrides == cells[key].overrides, key


@pytest.mark.parametrize("claims_line, words", [
    ('claims = [["a", "nope"]]', "nope are not in its [methods]"),
    ('claims = [["a", "a"]]', "[better, worse] method pairs"),
    ('claims = "a > b"', "[better, worse] method pairs"),
    ('claims = [["a", "b"]]\nmethods = ["a"]', "a claim names a method its row does not run (r: b)"),
])
def test_a_bad_claims_row_is_refused_naming_it(tmp_path, claims_line, words):
    bad = tmp_path / "tables.toml"
    bad.write_text('[targets.t]\nours = "a"\n[targets.t.methods]\na = {}\nb = {}\n'
                   f'[[targets.t.rows]]\nname = "r"\n{claims_line}\n')
    with pytest.raises(ReproduceError) as err:
        parse_tables(bad)
    assert words in str(err.value) and "targets.t" in str(err.value)


PAPER_DIFFERENCES_ROW = ('[targets.t]\nours = "a"\n[targets.t.methods]\na = {{}}\nb = {{}}\nc = {{}}\n'
                         '[[targets.t.rows]]\nname = "r"\npublished = {{ a = 55.0, b = 50.0 }}\n'
                         'claims = [["a", "b"], ["c", "b"]]\n{line}\n')


def test_a_rows_paper_differences_name_the_nearest_cell(tmp_path):
    """``paper_differences`` gives a claim whose cell the paper does not publish the difference of
    the nearest cell, with its source, in either TOML spelling; the claims read off published
    numbers need none."""
    good = tmp_path / "tables.toml"
    good.write_text(PAPER_DIFFERENCES_ROW.format(
        line='paper_differences = { "c>b" = { value = 2.5, source = "Table 4, the c row at Dir 0.3" } }'))
    (row,) = parse_tables(good)["t"].rows
    assert row.paper_differences == {("c", "b"): (2.5, "Table 4, the c row at Dir 0.3")}
    # the same as a sub-table of the row, spaces around ">" allowed
    good.write_text(PAPER_DIFFERENCES_ROW.format(
        line='[targets.t.rows.paper_differences."c > b"]\nvalue = 2\nsource = "Table 4"'))
    (row,) = parse_tables(good)["t"].rows
    assert row.paper_differences == {("c", "b"): (2.0, "Table 4")}
    # a rounds table: the value is rounds saved (> 0), its published claims the lower count first
    rounds = tmp_path / "rounds.toml"
    rounds.write_text('[targets.t]\nours = "a"\nmetric = "rounds"\n[targets.t.methods]\na = {}\nb = {}\nc = {}\n'
                      '[[targets.t.rows]]\nname = "r"\ntarget_accuracy = 40\npublished = { a = 120, b = inf }\n'
                      'claims = [["a", "b"], ["c", "b"]]\n'
                      'paper_differences = { "c>b" = { value = inf, source = "Table 3, Dir 0.6: b never reached 38%" } }\n')
    (row,) = parse_tables(rounds)["t"].rows
    assert row.paper_differences == {("c", "b"): (math.inf, "Table 3, Dir 0.6: b never reached 38%")}
    rounds.write_text(rounds.read_text().replace("a = 120, b = inf", "a = 300, b = 200"))
    with pytest.raises(ReproduceError, match=r"the claim a > b is not the order of its published numbers \(a 300, "
                                             r"b 200, metric rounds\)"):
        parse_tables(rounds)


@pytest.mark.parametrize("line, words", [
    ("", 'rows[0]: the claim c > b has no paper\'s difference: publish both methods or give paper_differences."c>b"'),
    ('paper_differences = [2.5, "Table 4"]', 'rows[0].paper_differences: expected a table of "better>worse"'),
    ('paper_differences = { "c-b" = { value = 2.5, source = "T4" } }', "key 'c-b' is not \"better>worse\""),
    ('paper_differences = { "c>c" = { value = 2.5, source = "T4" } }', "key 'c>c' is not \"better>worse\""),
    ('paper_differences = { "c>b" = [2.5, "T4"] }', 'paper_differences."c>b": expected { value = a number > 0'),
    ('paper_differences = { "c>b" = { value = 2.5 } }', 'paper_differences."c>b": expected { value = a number > 0'),
    ('paper_differences = { "c>b" = { value = -2.5, source = "T4" } }', "expected { value = a number > 0"),
    ('paper_differences = { "c>b" = { value = 0, source = "T4" } }', "expected { value = a number > 0"),
    ('paper_differences = { "c>b" = { value = nan, source = "T4" } }', "expected { value = a number > 0"),
    ('paper_differences = { "c>b" = { value = "2.5", source = "T4" } }', "expected { value = a number > 0"),
    ('paper_differences = { "c>b" = { value = 2.5, source = " " } }', "expected { value = a number > 0"),
    ('paper_differences = { "c>b" = { value = 2.5, source = "T4", note = "x" } }', "expected { value = a number > 0"),
    ('paper_differences = { "c>nope" = { value = 2.5, source = "T4" } }', "methods nope are not in its [methods]"),
    ('paper_differences = { "c>b" = { value = 2.5, source = "T4" }, "b>c" = { value = 1, source = "T4" } }',
     'paper_differences."b>c": not one of the row\'s claims'),
    ('paper_differences = { "c>b" = { value = 2.5, source = "T4" }, "a>b" = { value = 5, source = "T4" } }',
     'paper_differences."a>b": both methods are published in this row'),
])
def test_a_bad_paper_differences_row_is_refused_naming_it(tmp_path, line, words):
    bad = tmp_path / "tables.toml"
    bad.write_text(PAPER_DIFFERENCES_ROW.format(line=line))
    with pytest.raises(ReproduceError) as err:
        parse_tables(bad)
    message = str(err.value)
    assert words in message and f"{bad}: targets.t" in message and "\n" not in message, message


def test_a_rows_components_name_the_component_of_an_ordering(tmp_path):
    """``components`` maps a claimed ordering to the component that distinguishes it, in either TOML
    spelling; the claims targets name FedMRUR's regulariser, relaxed initialisation and neuron-wise
    rates where the ordering is about one of them, and each better method's runs use it."""
    good = tmp_path / "tables.toml"
    good.write_text(PAPER_DIFFERENCES_ROW.format(
        line='paper_differences = { "c>b" = { value = 2.5, source = "T4" } }\n'
             'components = { "a>b" = "relaxed_init", "c > b" = "neuron_lr" }'))
    (row,) = parse_tables(good)["t"].rows
    assert row.components == {("a", "b"): "relaxed_init", ("c", "b"): "neuron_lr"}
    good.write_text(PAPER_DIFFERENCES_ROW.format(
        line='paper_differences = { "c>b" = { value = 2.5, source = "T4" } }\n'
             '[targets.t.rows.components]\n"a>b" = "fedmrur.hyperbolic"'))
    assert parse_tables(good)["t"].rows[0].components == {("a", "b"): "fedmrur.hyperbolic"}
    targets = load_targets()
    expected = {
        "fedmrur-claims": {("fedmrur", "fedmrur-n"): "fedmrur.hyperbolic"},
        "fedmrur-claims-cifar10": {("fedmrur", "fedmrur-n"): "fedmrur.hyperbolic",
                                   ("fedmrur-mean", "fedmrur-n-mean"): "fedmrur.hyperbolic"},
        "fedinit-claims": {("fedinit", "fedavg"): "relaxed_init", ("scaffold-ri", "scaffold"): "relaxed_init"},
        "fedinit-claims-cifar10": {("fedinit", "fedavg"): "relaxed_init", ("scaffold-ri", "scaffold"): "relaxed_init"},
        "fednlr-claims": {("fednlr", "fedavg"): "neuron_lr", ("feddyn-nlr", "feddyn"): "neuron_lr",
                          ("feddyn-nlr-wd1e-3", "feddyn-wd1e-3"): "neuron_lr"},
        "fednlr-claims-cifar10": {("fednlr", "fedavg"): "neuron_lr", ("feddyn-nlr", "feddyn"): "neuron_lr",
                                  ("feddyn-nlr-wd1e-3", "feddyn-wd1e-3"): "neuron_lr"},
        "fedmr-claims": {}, "fedmr-claims-cifar10": {},  # recombination and FedMut have no "off" switch
    }
    for name, components in expected.items():
        assert {p: c for r in targets[name].rows for p, c in r.components.items()} == components, name
        for scale in ("cpu", "paper") if targets[name].has_cpu_scale else ("paper",):
            for spec in plan(targets[name], scale, tmp_path / "out", seeds=[0]):  # the better methods use them
                used = {c.name for c in build_config(spec.config, spec.overrides).components}
                assert {c for (better, _), c in spec.row.components.items() if better == spec.method} <= used


@pytest.mark.parametrize("line, words", [
    ('components = ["a>b", "relaxed_init"]', 'rows[0].components: expected a table of "better>worse" = "component"'),
    ('components = { "a-b" = "relaxed_init" }', "key 'a-b' is not \"better>worse\""),
    ('components = { "a>a" = "relaxed_init" }', "key 'a>a' is not \"better>worse\""),
    ('components = { "a>b" = "hyperbolic" }', "rows[0].components.\"a>b\": 'hyperbolic' is not a component; allowed: "
                                              "fedmrur.hyperbolic, neuron_lr, relaxed_init"),
    ('components = { "a>b" = 1 }', "rows[0].components.\"a>b\": 1 is not a component"),
    ('components = { "a>nope" = "neuron_lr" }', "methods nope are not in its [methods]"),
    ('components = { "b>a" = "neuron_lr" }', 'rows[0].components."b>a": not one of the row\'s claims'),
])
def test_a_bad_components_row_is_refused_naming_it(tmp_path, line, words):
    bad = tmp_path / "tables.toml"
    bad.write_text(PAPER_DIFFERENCES_ROW.format(line='paper_differences = { "c>b" = { value = 2.5, source = "T4" } }\n'
                                                + line))
    with pytest.raises(ReproduceError) as err:
        parse_tables(bad)
    message = str(err.value)
    assert words in message and f"{bad}: targets.t" in message and "\n" not in message, message


def test_a_component_the_better_methods_runs_do_not_use_is_refused_when_planned(tmp_path):
    """A row may name only a component the better method's runs use: else no run would record its
    activity and the ordering could never be found inert. Checked on each planned cell's config."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="synthetic") + 'claims = [["fedprox", "fedavg"]]\n'
                                                         'components = { "fedprox>fedavg" = "relaxed_init" }\n')
    target = parse_tables(tables)["tiny"]
    with pytest.raises(ReproduceError) as err:
        plan(target, "paper", tmp_path / "out")
    assert str(err.value) == ('tiny, row dir0.5: components."fedprox>fedavg" = \'relaxed_init\', but fedprox\'s runs do '
                              "not use it (they use: no component)")
    # the same ordering where FedProx runs with relaxed initialisation plans
    tables.write_text(tables.read_text().replace('"fedprox.mu=0.01"]', '"fedprox.mu=0.01", "relaxed_init.beta=0.1"]'))
    assert len(plan(parse_tables(tables)["tiny"], "paper", tmp_path / "out")) == 4


def test_a_claim_against_its_published_numbers_is_refused(tmp_path):
    bad = tmp_path / "tables.toml"
    bad.write_text(PAPER_DIFFERENCES_ROW.format(line="").replace('["c", "b"]', '["b", "a"]'))
    with pytest.raises(ReproduceError, match=r"rows\[0\]: the claim b > a is not the order of its published numbers "
                                             r"\(b 50, a 55, metric accuracy\)"):
        parse_tables(bad)


@pytest.mark.skipif(not SPECS.is_dir(), reason="../shared/specs is not present")
def test_every_claim_has_the_papers_difference(targets):
    """Every claim of the claims targets has the paper's difference: its row's published numbers,
    or, for FedMR's two-stage and momentum-0.5 claims (no such cell in the paper), the nearest cell,
    Table 1's CNN / CIFAR-10 / α = 0.1 FedMR − FedAvg, read here from the spec."""
    header, rows = spec_table("fedmr.md", "### 6.1 Table 1")
    cnn = next(r for r in rows if r[:3] == ["CNN", "Cifar-10", "0.1"])
    table1 = spec_cell(cnn[header.index("FedMR")])[0] - spec_cell(cnn[header.index("FedAvg")])[0]
    nearest = {}
    for name in CLAIMS_TARGETS:
        for row in targets[name].rows:
            published = {m: v[0] for m, v in row.published.items()}
            for better, worse in row.claims:
                if better in published and worse in published:
                    assert published[better] > published[worse], (name, row.name, better, worse)
                    assert (better, worse) not in row.paper_differences
                else:
                    nearest[name, row.name, better, worse] = row.paper_differences[better, worse]
    assert set(nearest) == {("fedmr-claims", "paper", "fedmr-2stage", "fedavg"),
                            ("fedmr-claims", "momentum-0.5", "fedmr", "fedavg")}
    for value, source in nearest.values():
        assert value == pytest.approx(table1) and "Table 1, CNN / CIFAR-10 / Dir α = 0.1" in source


# ------------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedsuite.cli.main", "reproduce", *args]


TINY = """
paper = "a tiny table for tests"

[targets.tiny]
title = "tiny: FedProx against FedAvg on the generated data"
ours = "fedprox"
metric = "accuracy"
last = 2
spread = "seeds"
seeds = [0, 1]
set = ["dataset={dataset}", "model=mlp", "num_clients=10", "clients_per_round=4", "rounds=2",
       "batch_size=32", "faults.delay_s=1.0"]

[targets.tiny.cpu]
set = []

[targets.tiny.methods]
fedavg = {{ label = "FedAvg", set = ["strategy=fedavg"] }}
fedprox = {{ label = "FedProx", set = ["strategy=fedprox", "fedprox.mu=0.01"] }}

[[targets.tiny.rows]]
name = "dir0.5"
label = "Synthetic, Dir 0.5"
set = ["alpha=0.5"]
published = {{ fedavg = [50.0, 1.0], fedprox = [51.0, 1.0] }}
"""


def test_a_run_another_queue_is_running_is_left_to_it_and_not_called_failed(tmp_path):
    """Two queues of one target (``experiments/claims.sh``'s two lanes) reach the same run: the one
    that finds its folder held by another fedsuite process (``hold.claimed``) starts nothing
    there, leaves the folder as it is and says so ("in use", not "failed"); the run does not count
    as completed for this queue. A run no one holds is run as before."""
    import io

    from rich.console import Console

    from fedsuite.queues.reproduce.queue import IN_USE, run_queue

    tables = tmp_path / "tables.toml"
    tables.write_text(TINY.format(dataset="synthetic").replace(', "faults.delay_s=1.0"', ""))
    target = parse_tables(tables)["tiny"]
    specs = plan(target, "cpu", tmp_path / "out", methods=["fedavg"], seeds=[0, 1], data_root=str(tmp_path / "data"))
    held, free = specs
    held.run_dir.mkdir(parents=True)
    console = Console(file=io.StringIO(), width=200)
    with hold.claimed(held.run_dir):  # this test process is the other queue, mid-run
        assert hold.held_elsewhere(held.run_dir)  # a second open file of the folder, as another process's
        states = run_queue(specs, console=console, poll_s=0.05, placement=["--engine", "inprocess"])
    said = console.file.getvalue()
    assert states == {held.run_dir: IN_USE, free.run_dir: "completed"}, said
    assert f"in use    {held.label}: another fedsuite process runs it; left to that one" in said
    assert "failed" not in said and list(held.run_dir.iterdir()) == []
    assert hold.held_elsewhere(held.run_dir) is False  # released with the hold


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="fmnist"))
    base = ["--tables", str(tables), "--output-dir", str(tmp_path / "out"), "--data-root", str(tmp_path / "nodata")]
    for args, words in ((["nope"], "unknown target 'nope'"), (["tiny", "--rows", "x"], "unknown row x"),
                        (["tiny", "--methods", "fedyogi"], "unknown method fedyogi"),
                        (["tiny", "--jobs", "0"], "--jobs must be at least 1")):
        out = fedsuite_run(["reproduce", *args, *base], env=_env(), timeout=120)
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and words in out.stderr, out.stderr
    # missing data: the missing files and the layout are named, nothing is started or created
    out = fedsuite_run(["reproduce", "tiny", "--scale", "paper", *base], env=_env(), timeout=120)
    assert out.returncode == 2
    assert "missing data, nothing was started" in out.stderr and "train-images-idx3-ubyte.gz" in out.stderr
    assert "Expected layout" in out.stderr
    assert not (tmp_path / "out").exists()


def test_without_scale_a_machine_without_a_gpu_gets_the_cpu_scale_or_a_refusal(tmp_path):
    """``--scale`` defaulted to ``paper``: a bare ``fedsuite reproduce fedinit-claims`` started 500
    rounds of ResNet-18 on a CPU without a word. Given no ``--scale``, a run with a GPU (or a Ray
    cluster) gets the paper's settings; without one, the target's cpu scale where it has one, said in
    a line; a target with only the paper scale is refused, naming its runs and rounds, before
    anything starts (``--scale paper`` starts it anyway); ``--report`` runs nothing and reads the
    paper scale of such a target."""
    from fedsuite.queues.reproduce import default_scale

    targets = load_targets()
    claims, cifar = targets["fedinit-claims"], targets["fedinit-claims-cifar10"]
    assert claims.has_cpu_scale and not cifar.has_cpu_scale

    def plan_paper(target):
        return lambda: plan(target, "paper", tmp_path / "out")

    for target in (claims, cifar):
        assert default_scale(target, [], False, True, plan_paper(target)) == "paper"  # a GPU here
        assert default_scale(target, ["--ray-address", "auto"], False, False, plan_paper(target)) == "paper"
    assert default_scale(claims, [], False, False, plan_paper(claims)) == "cpu"
    assert default_scale(cifar, [], True, False, plan_paper(cifar)) == "paper"  # --report: nothing runs
    runs = plan(cifar, "paper", tmp_path / "out")
    with pytest.raises(ReproduceError) as refused:
        default_scale(cifar, [], False, False, plan_paper(cifar))
    assert str(refused.value) == (
        f"fedinit-claims-cifar10 has only the paper scale, {len(runs)} runs of {sum(r.rounds for r in runs)} rounds "
        "in all (cnn on cifar10), sized for GPUs, and this machine has none: pass --scale paper to start them on "
        "its CPU anyway")
    # the command on this machine, as it is
    from fedsuite.queues.reproduce import gpu_here

    out = fedsuite_run(["reproduce", "fedinit-claims-cifar10", "--output-dir", str(tmp_path / "o"), "--data-root",
                        str(tmp_path / "nodata")], env=_env(), timeout=300)
    assert out.returncode == 2 and not (tmp_path / "o").exists(), out.stdout + out.stderr
    if gpu_here():  # the paper scale, stopped by the missing data
        assert out.stdout.startswith("--scale paper: ") and "missing data" in out.stderr, out.stdout + out.stderr
    else:
        assert out.stdout == "" and out.stderr == f"error: {refused.value}\n", out.stderr
    out = fedsuite_run(["reproduce", "fedinit-claims", "--output-dir", str(tmp_path / "o"), "--data-root",
                        str(tmp_path / "nodata")], env=_env(), timeout=300)
    assert out.returncode == 2 and "missing data, nothing was started" in out.stderr, out.stdout + out.stderr
    assert out.stdout.startswith("--scale paper: " if gpu_here() else "--scale cpu: the target's CPU-sized variant, "
                                 "the default on a machine without a GPU"), out.stdout


def test_options_take_several_values_after_one_flag_and_a_usage_error_is_one_line(tmp_path):
    """``--rows a b``, ``--methods a b`` and ``--seeds 0 1 2`` as the README writes them (a click option
    takes one value per flag); a usage error (no value, a bad value, an unknown option) is one line, exit 2."""
    from typer.testing import CliRunner

    from fedsuite.cli.main import app
    from fedsuite.cli.support import ManyValuesCommand

    spread = ManyValuesCommand("reproduce").spread
    assert spread(["t", "--rows", "a", "b", "--seeds", "0", "-1", "--jobs", "2", "--methods=m", "--report"]) == [
        "t", "--rows", "a", "--rows", "b", "--seeds", "0", "--seeds", "-1", "--jobs", "2", "--methods", "m", "--report"]
    assert spread(["--seeds", "1", "t", "--", "--rows"]) == ["--seeds", "1", "--seeds", "t", "--", "--rows"]
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="synthetic"))
    base = ["reproduce", "tiny", "--scale", "paper", "--tables", str(tables), "--output-dir", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*base, "--seeds", "0", "1", "--methods", "fedavg", "fedprox", "--report"])
    assert result.exit_code == 0, result.output
    assert [r["seeds_planned"] for r in csv.DictReader((tmp_path / "out/tiny/paper/tiny/report.csv").open())] == ["2", "2"]
    for args, words in ((["--seeds"], "--seeds expects one or more values"), (["--seeds", "a"], "got 'a'"),
                        (["--scale", "gpu"], "unknown scale 'gpu'"), (["--bogus"], "No such option '--bogus'"),
                        (["--jobs", "x"], "'x' is not a valid integer")):
        result = CliRunner().invoke(app, [*base, *args])
        text = result.stdout + (result.stderr or "")
        assert result.exit_code == 2 and words in text and len(text.strip().splitlines()) == 1, text


def _state(run_dir: Path) -> str:
    return rundir.state(run_dir)


@pytest.mark.long
def test_kill_and_restart_resumes_and_reports(tmp_path):
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="synthetic"))
    out = tmp_path / "out"
    common = ["--tables", str(tables), "--data-root", str(tmp_path / "data")]
    # the queue is the subject, not how a run's messages travel: every run on the in-process engine.
    # Flower's processes under a kill: a killed batch of Flower runs and a kill -9 of a run with its
    # private Ray (tests/test_resume.py), a CLI's process group killed (tests/test_robustness.py)
    inprocess = ["--engine", "inprocess"]
    runs = out / "tiny" / "paper" / "dir0.5"
    first, second = runs / "fedavg-s0", runs / "fedavg-s1"

    # the cell that will be interrupted, run without interruption (beside step 1, into another folder)
    ref_out = tmp_path / "reference"
    ref = subprocess.Popen(_cmd("tiny", "--scale", "paper", "--output-dir", str(ref_out), "--methods", "fedavg", "--seeds", "1", *common,
                                *inprocess),
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)

    # 1. one run at a time; SIGKILL the command's process group once the second run is mid-way
    proc = subprocess.Popen(_cmd("tiny", "--scale", "paper", "--output-dir", str(out), "--jobs", "1", *common, *inprocess), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900  # a guard against a hang, not a timing: the suite shares 2 cores
    while time.monotonic() < deadline and proc.poll() is None:
        if _state(first) == "completed" and any(r["round"] >= 1 for r in read_metrics(second, tolerant=True)):
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.stdout.read().decode()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # a run's process holds its folder (hold.claimed: a flock the kernel drops when the process ends)
    deadline = time.monotonic() + 60
    while any(hold.held_elsewhere(run) for run in (first, second)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(hold.held_elsewhere(run) for run in (first, second)), "a run outlived the killed command"
    assert _state(first) == "completed" and _state(second) == "partial"
    before = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}

    # 2. the same command again, two runs at a time
    again = fedsuite_run(["reproduce", "tiny", "--scale", "paper", "--output-dir", str(out), "--jobs", "2", *common, *inprocess],
                         env=_env(), timeout=900)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text
    ref_text, _ = ref.communicate(timeout=900)
    assert ref.returncode == 0, ref_text
    assert re.search(r"resume dir0\.5 fedavg s1", text), text
    assert "fedavg s0 ->" not in text, "a completed run was started again"

    # nothing ran twice: the finished run is untouched, every run has rounds 0, 1, 2 once each
    assert {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()} == before
    for run in sorted(runs.glob("*-s*")):
        if run.is_dir():
            assert _state(run) == "completed", run
            assert [r["round"] for r in read_metrics(run)] == [0, 1, 2], run

    # the resumed run equals the uninterrupted one, bit for bit
    reference = ref_out / "tiny" / "paper" / "dir0.5" / "fedavg-s1"
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]  # noqa: E731
    assert strip(read_metrics(second)) == strip(read_metrics(reference))
    assert_same_arrays(torch.load(second / "checkpoint.pt", weights_only=False)["arrays"],
                       torch.load(reference / "checkpoint.pt", weights_only=False)["arrays"])

    # the report is complete: both methods, both seeds, a verdict, a figure; written at the end
    report = out / "tiny" / "paper" / "tiny"
    rows = list(csv.DictReader((report / "report.csv").open()))
    assert [(r["method"], r["seeds_completed"]) for r in rows] == [("fedavg", "2"), ("fedprox", "2")]
    assert all(r["obtained_mean"] and r["obtained_sample_std"] and r["difference"] for r in rows)
    md = (report / "report.md").read_text()
    # the one published ordering (FedProx > FedAvg), judged on the two seeds' paired differences
    (claim,) = list(csv.DictReader((report / "claims.csv").open()))
    assert (claim["better"], claim["worse"], claim["seeds_paired"], claim["seeds"]) == ("fedprox", "fedavg", "2", "0 1")
    runs_value = {(m, s): run_value([(r["round"], r["test_accuracy"]) for r in read_metrics(runs / f"{m}-s{s}")
                                     if r["round"] > 0], "accuracy", last=2)[0]
                  for m in ("fedavg", "fedprox") for s in (0, 1)}
    diffs = [runs_value["fedprox", s] - runs_value["fedavg", s] for s in (0, 1)]
    assert [float(d) for d in claim["differences"].split()] == pytest.approx(diffs, abs=1e-4)
    assert float(claim["paper_difference"]) == pytest.approx(1.0)  # published FedProx 51 − FedAvg 50
    assert claim["verdict"] == paired_verdict(diffs, paper_difference=1.0).verdict
    assert f"| FedProx > FedAvg | 2 | {float(claim['mean_difference']):+.2f} |" in md
    assert (report / "dir0.5.png").stat().st_size > 0

    # --report alone rewrites the same report from the runs on disk
    out2 = fedsuite_run(["reproduce", "tiny", "--scale", "paper", "--output-dir", str(out), "--report", *common], env=_env(), timeout=120)
    assert out2.returncode == 0 and list(csv.DictReader((report / "report.csv").open())) == rows

    # numbers labelled cpu scale are compared on orderings only: no difference against the paper
    target = parse_tables(tables)["tiny"]
    specs = plan(target, "paper", out, data_root=str(tmp_path / "data"))
    md = write_report(target, specs, "cpu", tmp_path / "cpu-report").read_text()
    assert "CPU scale: obtained numbers are not the paper's setting" in md
    cpu_rows = list(csv.DictReader((tmp_path / "cpu-report" / "report.csv").open()))
    assert [r["difference"] for r in cpu_rows] == ["n/a", "n/a"] and md.count("n/a (cpu scale)") == 2


def test_report_names_each_run_that_did_not_complete_and_why(tmp_path):
    """A failed run is left out of the numbers and listed under its row with the failure its
    summary.json records; a run never started is listed as not run."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="synthetic"))
    target = parse_tables(tables)["tiny"]
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    for (method, seed), acc in {("fedavg", 0): 0.5, ("fedavg", 1): 0.6, ("fedprox", 0): 0.7}.items():
        run = specs[method, seed].run_dir
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"round": r, "test_accuracy": acc if r else 0.1}) + "\n" for r in range(3)))
        (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    failed = specs["fedprox", 1].run_dir
    failed.mkdir(parents=True)
    (failed / "metrics.jsonl").write_text(json.dumps({"round": 0, "test_accuracy": 0.1}) + "\n"
                                          + json.dumps({"round": 1, "test_accuracy": 0.1}) + "\n")
    (failed / "summary.json").write_text(json.dumps({"status": "failed", "failure": {
        "round": 2, "message": "round 2: 4 of 4 client replies failed; first error: non-finite values"}}))
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert "Runs that did not complete (not in the numbers above):" in md
    assert ("- fedprox seed 1: failed, stopped after round 1: round 2: 4 of 4 client replies failed; "
            "first error: non-finite values") in md
    assert "| FedProx | 51.00 ± 1.00 | 70.00 | 1/2 |" in md  # the completed seed only
    # the published ordering FedProx > FedAvg, paired on seed 0 only (FedProx's seed 1 failed): 70 - 50
    (claim,) = csv.DictReader((tmp_path / "report" / "claims.csv").open())
    assert (claim["seeds"], float(claim["differences"]), claim["verdict"]) == ("0", 20.0, NOT_JUDGED)
    assert "| FedProx > FedAvg | 1 | +20.00 | - | - | - | +1.00 | **not judged** |" in md
    shutil.rmtree(specs["fedavg", 1].run_dir)
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert "- fedavg seed 1: not run" in md


def _tiny_target(tmp_path: Path, methods: str, rows: str = "", three_seeds: bool = True):
    """TINY's target (Synthetic, FedProx against FedAvg) with ``methods`` (TOML lines) added to its
    [methods], ``rows`` (TOML) appended after its row, and seeds 0-2 unless ``three_seeds`` is false."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    text = TINY.format(dataset="synthetic")
    fedprox = 'fedprox = { label = "FedProx", set = ["strategy=fedprox", "fedprox.mu=0.01"] }\n'
    assert text.count(fedprox) == 1
    text = text.replace(fedprox, fedprox + methods)
    tables.write_text((text.replace("seeds = [0, 1]", "seeds = [0, 1, 2]") if three_seeds else text) + rows)
    return parse_tables(tables)["tiny"]


def _write_runs(specs: dict, accuracies: dict, rounds: int = 2) -> None:
    """Completed runs on disk as ``fedsuite simulate`` leaves them: round 0 at 10%, then rounds 1..
    ``rounds`` at the run's accuracy (a fraction; a list: one per round)."""
    for key, acc in accuracies.items():
        run = specs[key].run_dir
        run.mkdir(parents=True)
        per_round = acc if isinstance(acc, list) else [acc] * rounds
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"round": r, "test_accuracy": a}) + "\n" for r, a in enumerate([0.1, *per_round])))
        (run / "summary.json").write_text(json.dumps({"status": "completed"}))


def test_the_report_shows_the_papers_difference_beside_each_ordering(tmp_path):
    """Each ordering's row of report.md and claims.csv carries the paper's difference: its published
    numbers', or the nearest cell's, marked and named under the table; the verdicts weigh the
    paired differences against it, and the row's summary counts them."""
    target = _tiny_target(tmp_path, 'fedprox-big = { label = "FedProx μ=0.1", set = ["strategy=fedprox", "fedprox.mu=0.1"] }\n',
                          'claims = [["fedprox", "fedavg"], ["fedprox-big", "fedavg"]]\n'
                          'paper_differences = { "fedprox-big>fedavg" = { value = 5.0, source = "Table 9, the μ = 0.1 cell" } }\n')
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    # per seed, FedProx − FedAvg = −1, 0, +1 (95% interval ±2.48 holds the paper's 51 − 50 = 1); FedProx
    # μ=0.1 − FedAvg = 0, +0.5, −0.5 (interval ±1.24, below the nearest cell's 5)
    _write_runs(specs, {("fedavg", 0): 0.50, ("fedavg", 1): 0.60, ("fedavg", 2): 0.55,
                        ("fedprox", 0): 0.49, ("fedprox", 1): 0.60, ("fedprox", 2): 0.56,
                        ("fedprox-big", 0): 0.50, ("fedprox-big", 1): 0.605, ("fedprox-big", 2): 0.545})
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert verdict_rule(0.95) in md
    assert "| row | holds | reversed | could not tell | smaller than the paper's | inert here | not judged |" in md
    assert "| Synthetic, Dir 0.5 | 0 | 0 | 1 | 1 | 0 | 0 |" in md
    assert "| ordering | seeds paired | mean difference | standard error | 95% interval | smallest difference these seeds could detect | paper's difference | verdict |" in md
    assert "| FedProx > FedAvg | 3 | +0.00 | 0.58 | [-2.48, +2.48] | 2.48 | +1.00 | **could not tell** |" in md
    assert "| FedProx μ=0.1 > FedAvg | 3 | +0.00 | 0.29 | [-1.24, +1.24] | 1.24 | +5.00† | **smaller than the paper's** |" \
        in md
    rows = list(csv.DictReader((tmp_path / "report" / "claims.csv").open()))
    assert {r["confidence"] for r in rows} == {"0.95"}
    assert float(rows[0]["half_width"]) == pytest.approx(t_quantile(0.95, 3) / math.sqrt(3))
    assert (float(rows[0]["interval_low"]), float(rows[0]["interval_high"])) == \
        (pytest.approx(-float(rows[0]["half_width"])), pytest.approx(float(rows[0]["half_width"])))
    assert "- FedProx μ=0.1 > FedAvg: Table 9, the μ = 0.1 cell" in md
    assert "**Row: 1 could not tell, 1 smaller than the paper's.**" in md
    # the figure of the orderings: one line each, seeds, mean with its t-interval and the paper's difference
    figure = tmp_path / "report" / "claims.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](claims.png)" in md
    own, near = csv.DictReader((tmp_path / "report" / "claims.csv").open())
    assert (own["better"], float(own["paper_difference"]), own["paper_difference_source"], own["verdict"]) == \
        ("fedprox", 1.0, "", COULD_NOT_TELL)
    assert (near["better"], float(near["paper_difference"]), near["paper_difference_source"], near["verdict"]) == \
        ("fedprox-big", 5.0, "Table 9, the μ = 0.1 cell", SMALLER_THAN_PAPERS)
    assert float(near["mean_difference"]) == pytest.approx(0.0, abs=1e-9)
    assert float(near["standard_error"]) == pytest.approx(0.5 / math.sqrt(3))
    cells = list(csv.DictReader((tmp_path / "report" / "report.csv").open()))
    assert {c["row_verdict"] for c in cells} == {"1 could not tell, 1 smaller than the paper's"}
    # at cpu scale the cells have no difference against the paper, the orderings keep the paper's
    md = write_report(target, list(specs.values()), "cpu", tmp_path / "cpu-report").read_text()
    assert "the paper's difference beside each ordering is the one it measured in its own setting" in md
    assert "| FedProx μ=0.1 > FedAvg | 3 | +0.00 | 0.29 | [-1.24, +1.24] | 1.24 | +5.00† | **smaller than the paper's** |" \
        in md
    assert md.count("n/a (cpu scale)") == 3
    # at 50% confidence (t = 0.82) the first interval is ±0.47, below the paper's 1: smaller; the rule says its level
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report", confidence=0.5).read_text()
    assert "at 50% confidence" in md and "| 50% interval |" in md and "**Row: 2 smaller than the paper's.**" in md
    assert {r["confidence"] for r in csv.DictReader((tmp_path / "report" / "claims.csv").open())} == {"0.5"}


def test_a_row_on_another_model_compares_orderings_not_numbers(tmp_path):
    """A row whose runs train another model than the paper's numbers were measured with
    (``model_deviation``: the CIFAR-10 claims cells of FedNLR, FedInit and FedMRUR) shows the
    published numbers for reference, no difference from them ("n/a (other model)", "n/a" in
    report.csv), the sentence naming the models, and judges the orderings as any row; a value that
    is not a string is refused, naming the key."""
    target = _tiny_target(tmp_path, "", 'model_deviation = "an MLP; the paper\'s numbers are a CNN\'s"\n')
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    _write_runs(specs, {("fedavg", 0): 0.50, ("fedavg", 1): 0.60, ("fedavg", 2): 0.55,
                        ("fedprox", 0): 0.53, ("fedprox", 1): 0.62, ("fedprox", 2): 0.58})
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert "| FedAvg | 50.00 ± 1.00 | 55.00 ± 5.00 | 3/3 | 55.00 | n/a (other model) |" in md
    assert md.count("n/a (other model)") == 2
    assert ("These runs train another model than the paper's numbers were measured with (an MLP; the paper's "
            "numbers are a CNN's): the published numbers are shown for reference, and only the orderings are "
            "compared.") in md
    assert "| FedProx > FedAvg | 3 | +2.67 | 0.33 | [+1.23, +4.10] | 1.43 | +1.00 | **holds** |" in md
    assert {c["difference"] for c in csv.DictReader((tmp_path / "report" / "report.csv").open())} == {"n/a"}
    bad = tmp_path / "bad" / "tables.toml"
    bad.parent.mkdir()
    bad.write_text(TINY.format(dataset="synthetic") + "model_deviation = 3\n")
    with pytest.raises(ReproduceError, match=r"rows\[0\]\.model_deviation: expected a string, got 3"):
        parse_tables(bad)


def test_rows_sharing_a_setting_share_runs_and_report_only_their_own_methods(tmp_path):
    """A row that names its methods and shares another row's setting folder (FedMut at spec A27's
    alternative beside FedMR's momentum-0.5 row) plans only its new method's runs, reads the shared
    FedAvg runs, and shows only the methods it names, in its cells and in its list of runs not
    completed; the other row does not show the new method."""
    target = _tiny_target(tmp_path, 'fedprox-big = { label = "FedProx μ=0.1", set = ["strategy=fedprox", "fedprox.mu=0.1"] }\n',
                          'methods = ["fedavg", "fedprox"]\n'  # TINY's row, then one sharing its folder
                          '\n[[targets.tiny.rows]]\nname = "dir0.5-big"\nsetting = "dir0.5"\nlabel = "Synthetic, Dir 0.5, μ = 0.1"\n'
                          'set = ["alpha=0.5"]\nmethods = ["fedavg", "fedprox-big"]\nclaims = [["fedprox-big", "fedavg"]]\n'
                          'paper_differences = { "fedprox-big>fedavg" = { value = 1.0, source = "the μ = 0.01 cell" } }\n',
                          three_seeds=False)
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    assert sorted(specs) == [(m, seed) for m in ("fedavg", "fedprox", "fedprox-big") for seed in (0, 1)]
    assert specs["fedprox-big", 0].run_dir.parent == specs["fedavg", 0].run_dir.parent  # one folder
    assert [s.method for s in plan(target, "paper", tmp_path / "out", methods=["fedprox-big"])] == ["fedprox-big"] * 2
    _write_runs(specs, {("fedavg", 0): 0.50, ("fedavg", 1): 0.60, ("fedprox", 0): 0.52,
                        ("fedprox", 1): 0.61, ("fedprox-big", 0): 0.55})
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    first, second = md.split("## Synthetic, Dir 0.5")[1:]
    assert "| FedProx | 51.00 ± 1.00 | 56.50 ± 6.36 | 2/2 |" in first and "FedProx μ=0.1" not in first
    assert "| FedAvg | - | 55.00 ± 7.07 | 2/2 |" in second and "| FedProx μ=0.1 | - | 55.00 | 1/2 |" in second
    assert "| FedProx |" not in second
    assert "- fedprox-big seed 1: not run" in second and "fedprox-big" not in first
    assert "| FedProx μ=0.1 > FedAvg | 1 | +5.00 | - | - | - | +1.00† | **not judged** |" in second


def test_a_row_whose_runs_record_a_server_momentum_gets_its_figure(tmp_path, monkeypatch):
    """A row with methods that record a server momentum (FedCM, with and without the normalised
    reaggregation) gets ``<row>-momentum.png`` beside its accuracy figure, drawing each such method
    (FedProx and FedAvg record none) with 1/(1−α) for the one whose momentum is built from the
    normalised update (read from its runs' config.json, as ``fedsuite simulate`` writes it)."""
    from fedsuite.queues.reproduce import report as report_module
    from fedsuite.queues.reproduce.planning import cell_overrides

    target = _tiny_target(tmp_path, 'fedcm = { label = "FedCM", set = ["strategy=fedcm", "fedcm.alpha=0.2"] }\n'
                                    'fedcm-n = { label = "FedCM+N", set = ["strategy=fedcm", "fedcm.alpha=0.2", '
                                    '"fedcm.normalize=true"] }\n', three_seeds=False)
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    _write_runs(specs, {key: 0.5 for key in specs})
    for (method, seed), spec in specs.items():
        row = spec.row
        cfg = build_config(row.config, cell_overrides(target, row, method, "paper"))
        (spec.run_dir / "config.json").write_text(json.dumps(cfg.active_dump()))
        if method.startswith("fedcm"):
            rows = [{"round": 0, "test_accuracy": 0.1}] + [
                {"round": r, "test_accuracy": 0.5, "momentum_norm": 0.1 * r, "d_t": 1.0 + 0.1 * r} for r in (1, 2)]
            (spec.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn = []
    real = report_module.plot_server_momentum
    monkeypatch.setattr(report_module, "plot_server_momentum",
                        lambda curves, path, limits, title: drawn.append((sorted(curves), limits, title))
                        or real(curves, path, limits, title=title))
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    row = target.rows[0]
    figure = tmp_path / "report" / f"{row.name}-momentum.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({figure.name})" in md
    assert drawn == [(["FedAvg", "FedCM", "FedCM+N", "FedProx"], {"FedCM+N": pytest.approx(1 / 0.8, rel=1e-12)},
                      f"{row.label} (paper scale): the server momentum")]
    for spec in specs.values():  # no run records a momentum: no figure
        if spec.method.startswith("fedcm"):
            shutil.rmtree(spec.run_dir)
    shutil.rmtree(tmp_path / "report")
    write_report(target, list(specs.values()), "paper", tmp_path / "report")
    assert not figure.exists() and (tmp_path / "report" / f"{row.name}.png").is_file() and len(drawn) == 1


def test_the_report_says_inert_here_with_the_measured_activity(tmp_path):
    """Where a row names the component of an ordering, report.md and claims.csv show its measure and
    the better method's value (the runs' summary.json ``activity``, mean over the paired seeds): below
    the threshold the verdict is **inert here**; above it, judged; runs recorded before activity was
    measured say "activity not recorded" and are judged as before. Orderings without a component
    have empty activity columns."""
    target = _tiny_target(tmp_path, 'fedinit = { label = "FedInit", set = ["strategy=fedinit"] }\n'
                                    'fednlr = { label = "FedNLR", set = ["strategy=fednlr"] }\n',
                          'claims = [["fedinit", "fedavg"], ["fednlr", "fedavg"], ["fedprox", "fedavg"]]\n'
                          'paper_differences = { "fedinit>fedavg" = { value = 3.0, source = "T1" }, '
                          '"fednlr>fedavg" = { value = 1.5, source = "T2" } }\n'
                          'components = { "fedinit>fedavg" = "relaxed_init", "fednlr>fedavg" = "neuron_lr" }\n')
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    accuracy = {"fedavg": 0.50, "fedprox": 0.51, "fedinit": 0.52, "fednlr": 0.53}
    _write_runs(specs, {(m, seed): accuracy[m] + 0.001 * seed for m, seed in specs})
    # FedInit's relaxation barely moved its starts (inert below 1e-4); FedNLR's rates spread (active)
    recorded = {"fedinit": ("relaxed_init", "relaxed-init-offset", 1e-4, [2e-5, 4e-5, 6e-5]),
                "fednlr": ("neuron_lr", "neuron-lr-spread", 1e-3, [0.12, 0.14, 0.16])}
    for method, (name, measure, threshold, values) in recorded.items():
        for seed, value in enumerate(values):
            run = specs[method, seed].run_dir
            summary = json.loads((run / "summary.json").read_text())
            summary["activity"] = {name: {"measure": measure, "mean": value, "last": value, "threshold": threshold,
                                          "rounds": 2, "inert": value < threshold}}
            (run / "summary.json").write_text(json.dumps(summary))
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert "| ordering | seeds paired | mean difference | standard error | 95% interval | smallest difference these seeds could detect | paper's difference | component activity | verdict |" in md
    assert "| FedInit > FedAvg | 3 | +2.00 | 0.00 | [+2.00, +2.00] | 0.00 | +3.00† | relaxed-init-offset 4e-05 < " \
           "0.0001 (inert) | **inert here** |" in md
    assert "| FedNLR > FedAvg | 3 | +3.00 | 0.00 | [+3.00, +3.00] | 0.00 | +1.50† | neuron-lr-spread 0.14 ≥ 0.001 | " \
           "**holds** |" in md
    assert "| FedProx > FedAvg | 3 | +1.00 | 0.00 | [+1.00, +1.00] | 0.00 | +1.00 | - | **holds** |" in md
    assert "- FedInit > FedAvg: `relaxed_init`, measured by `relaxed-init-offset` in FedInit's runs: " in md
    assert "| Synthetic, Dir 0.5 | 2 | 0 | 0 | 0 | 1 | 0 |" in md and "**Row: 2 hold, 1 inert here.**" in md
    by_pair = {(c["better"], c["worse"]): c for c in csv.DictReader((tmp_path / "report" / "claims.csv").open())}
    inert = by_pair["fedinit", "fedavg"]
    assert (inert["component"], inert["activity_measure"], float(inert["activity_value"]),
            float(inert["activity_threshold"]), inert["verdict"]) == \
        ("relaxed_init", "relaxed-init-offset", pytest.approx(4e-5), 1e-4, INERT_HERE)
    assert float(inert["mean_difference"]) == pytest.approx(2.0)  # the difference is still reported
    active = by_pair["fednlr", "fedavg"]
    assert (active["component"], float(active["activity_value"]), active["verdict"]) == \
        ("neuron_lr", pytest.approx(0.14), HOLDS)
    plain = by_pair["fedprox", "fedavg"]
    assert [plain[k] for k in ("component", "activity_measure", "activity_value", "activity_threshold")] == [""] * 4
    # the same runs recorded before activity was measured: said so, and judged as before
    for seed in range(3):
        run = specs["fedinit", seed].run_dir
        (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert "| FedInit > FedAvg | 3 | +2.00 | 0.00 | [+2.00, +2.00] | 0.00 | +3.00† | activity not recorded | **holds** |" in md
    by_pair = {(c["better"], c["worse"]): c for c in csv.DictReader((tmp_path / "report" / "claims.csv").open())}
    assert (by_pair["fedinit", "fedavg"]["activity_value"], by_pair["fedinit", "fedavg"]["verdict"]) == \
        (ACTIVITY_NOT_RECORDED, HOLDS)


def test_a_rounds_report_shows_rounds_saved(tmp_path):
    """A rounds-to-target table: differences and the paper's are rounds saved (worse − better); a
    published ∞ (never reached) is a paper's difference of +∞, above every band."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    text = TINY.format(dataset="synthetic").replace('metric = "accuracy"', 'metric = "rounds"').replace(
        '"rounds=2"', '"rounds=4"').replace("seeds = [0, 1]", "seeds = [0, 1, 2]").replace(
        "published = { fedavg = [50.0, 1.0], fedprox = [51.0, 1.0] }", "target_accuracy = 50\n"
        "published = { fedavg = inf, fedprox = 300 }")
    tables.write_text(text)
    target = parse_tables(tables)["tiny"]
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    # first round at 50%: FedAvg 3, 2, 4 and FedProx 2, 2, 2: 1, 0, 2 rounds saved
    _write_runs(specs, {("fedavg", 0): [0.3, 0.4, 0.5, 0.5], ("fedavg", 1): [0.3, 0.5, 0.5, 0.5],
                        ("fedavg", 2): [0.3, 0.4, 0.4, 0.6], ("fedprox", 0): [0.4, 0.5, 0.5, 0.5],
                        ("fedprox", 1): [0.4, 0.5, 0.5, 0.5], ("fedprox", 2): [0.4, 0.5, 0.5, 0.5]}, rounds=4)
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    # d̄ = 1, SE = 1/√3: the 95% interval [−1.48, 3.48] holds zero, the paper's ∞ lies above it
    assert "| FedProx > FedAvg | 3 | +1.00 | 0.58 | [-1.48, +3.48] | 2.48 | +∞ | **smaller than the paper's** |" in md
    (claim,) = csv.DictReader((tmp_path / "report" / "claims.csv").open())
    assert (claim["differences"], claim["paper_difference"], claim["verdict"]) == \
        ("1.0000 0.0000 2.0000", "inf", SMALLER_THAN_PAPERS)


def test_a_run_with_other_rounds_than_asked_is_continued_or_named_never_read(tmp_path):
    """A completed run with fewer rounds than its target asks (the target's rounds raised) is
    ``partial``: the queue continues it; one with more is ``longer``: left as it is. Neither is read
    into the numbers; both are named under their row with their rounds."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="synthetic").replace('"rounds=2"', '"rounds=3"'))
    target = parse_tables(tables)["tiny"]
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    assert {s.rounds for s in specs.values()} == {3}
    for (method, seed), last in {("fedavg", 0): 3, ("fedavg", 1): 3, ("fedprox", 0): 2, ("fedprox", 1): 4}.items():
        run = specs[method, seed].run_dir
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"round": r, "test_accuracy": 0.5 if r else 0.1}) + "\n" for r in range(last + 1)))
        (run / "summary.json").write_text(json.dumps({"status": "completed", "rounds_completed": last}))
    assert [rundir.state(specs[k].run_dir, 3) for k in sorted(specs)] == ["completed", "completed", "partial", "longer"]
    assert rundir.state(specs["fedprox", 0].run_dir) == "completed"  # asked for nothing: as recorded
    assert [s.label for s in pending(list(specs.values()))] == [specs["fedprox", 0].label]
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert "- fedprox seed 0: partial, completed 2 of 3 rounds (the queue continues it)" in md
    assert ("- fedprox seed 1: has 4 rounds, more than the 3 asked (a run is not cut short: ask for its rounds, "
            "or use another output folder)") in md
    assert "| FedProx | 51.00 ± 1.00 | - | 0/2 |" in md


# ------------------------------------------------------------------------------------------------
# a queue reuses a run only if it is the run asked for; a failed run is named (issue 42 item 3)
# ------------------------------------------------------------------------------------------------


def _record(run_dir: Path, cfg) -> Path:
    """``run_dir`` holding the ``config.json`` the ServerApp records for ``cfg`` (server_app.main)."""
    run_dir.mkdir(parents=True)
    write_json(run_dir / "config.json", cfg.active_dump())
    return run_dir


def test_a_run_is_the_run_asked_for_only_if_its_recorded_config_is(tmp_path):
    """``rundir.config_mismatch``: a field that makes another experiment is named, recorded value
    and asked value; the rounds (``rundir.state`` judges them), where the run lives (a moved
    folder, moved data) and what runs it (``--ray-address``, ``--num-gpus``) are not."""
    asked = build_config(values={**FAST, "strategy": "fedprox", "output_dir": str(tmp_path / "out"), "run_name": "r"})
    same = {**FAST, "strategy": "fedprox", "output_dir": str(tmp_path / "moved"), "run_name": "r-old", "rounds": 50,
            "data_root": "/elsewhere/data", "ray_address": "127.0.0.1:6379", "num_gpus": 0.5, "device": "cpu",
            "tensorboard": False}
    assert rundir.config_mismatch(_record(tmp_path / "same", build_config(values=same)), asked) == []

    other = {**same, "lr": 0.1, "fedprox.mu": 0.5, "dataset_options": {"iid": True}, "faults.client_error": 0.5}
    assert rundir.config_mismatch(_record(tmp_path / "other", build_config(values=other)), asked) == [
        'dataset_options: recorded {"iid": true}, asked {"num_devices": 30}', "faults.client_error: recorded 0.5, asked 0.0",
        "fedprox.mu: recorded 0.5, asked 0.01", "lr: recorded 0.1, asked 0.05"]
    # another method: its strategy first; a method's section that only one side has is not compared
    fedavg = _record(tmp_path / "fedavg", build_config(values={**same, "strategy": "fedavg", "alpha": 0.1}))
    assert rundir.config_mismatch(fedavg, asked) == ['strategy: recorded "fedavg", asked "fedprox"',
                                                     "alpha: recorded 0.1, asked 0.5"]
    # a record an older fedsuite wrote, without a field added since: the field counts at its default
    old = json.loads((tmp_path / "same" / "config.json").read_text())
    del old["min_replies"]
    (tmp_path / "same" / "config.json").write_text(json.dumps(old))
    assert rundir.config_mismatch(tmp_path / "same", asked) == []
    assert rundir.config_mismatch(tmp_path / "same", build_config(values={**same, "min_replies": 2})) == [
        "min_replies: recorded 1, asked 2"]

    # no config.json: a run never started, or one killed in its first seconds (debris), records no
    # run and differs from nothing: the queue starts it as before
    debris = tmp_path / "debris"
    debris.mkdir()
    (debris / "flower.log").write_text("starting\n")
    assert rundir.state(debris) == "debris" and rundir.config_mismatch(debris, asked) == []
    assert rundir.config_mismatch(tmp_path / "never", asked) == []
    # a record that cannot be read: one line naming it
    (tmp_path / "other" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^dir0\.5 fedavg s0: .*other/config.json cannot be read as JSON"):
        rundir.config_mismatch(tmp_path / "other", asked, who="dir0.5 fedavg s0")


def test_the_queue_stops_in_one_line_on_runs_of_another_config(tmp_path):
    """``check_recorded``: the first run of another config with its fields, how many more there
    are, and what to do; a failed run and a killed start-up of the config asked pass."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="synthetic"))
    specs = plan(parse_tables(tables)["tiny"], "paper", tmp_path / "out")
    assert [s.label for s in specs] == ["dir0.5 fedavg s0", "dir0.5 fedprox s0", "dir0.5 fedavg s1", "dir0.5 fedprox s1"]
    _record(specs[0].run_dir, specs[0].cfg)
    (specs[0].run_dir / "summary.json").write_text(json.dumps({"status": "failed", "rounds_completed": 1}))
    # the rows of the rounds it completed (a record without them is damaged: integrity.record_problem)
    (specs[0].run_dir / "metrics.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in range(2)))
    specs[1].run_dir.mkdir(parents=True)
    (specs[1].run_dir / "flower.log").write_text("starting\n")
    check_recorded(specs, "REMEDY")  # the runs asked for: nothing to say
    assert [s.label for s in pending(specs)] == ["dir0.5 fedprox s0", "dir0.5 fedavg s1", "dir0.5 fedprox s1"]
    assert [s.label for s in pending(specs, retry_failed=True)] == [s.label for s in specs]

    for spec in specs[2:]:
        _record(spec.run_dir, build_config(spec.config, [*spec.overrides, "alpha=0.1", "lr=0.1"]))
    with pytest.raises(ReproduceError) as err:
        pending(specs)
    assert str(err.value) == (
        f"{specs[2].run_dir} holds a run of another config (alpha: recorded 0.1, asked 0.5; lr: recorded 0.1, "
        "asked 0.05), and 1 more run of this queue differ; nothing was started: ask for the recorded config, or "
        "give the new runs another folder (another --output-dir)")


def test_claims_queue_status_names_each_unfinished_run_its_state_round_and_pace(tmp_path):
    """``experiments/claims.sh cifar10 status OUT``: each run folder with a checkpoint and no summary
    is listed, as running while a fedsuite process holds it (``hold.claimed``, the lock a run takes)
    and waiting otherwise, with its round of its rounds and its pace over its last rounds; a finished
    run (a summary) is not listed; the units that the last ``run`` had not taken follow (its
    ``.units/next``), the next named first."""
    out = tmp_path / "out"

    def run_folder(name: str, rounds: int, walls: list[float], finished: bool = False) -> Path:
        folder = out / "fednlr" / "paper" / "claims-c10n20-dir0.3" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"rounds": rounds}))
        lines = [{"round": 0, "test_accuracy": 0.1}] + [{"round": r, "wall_seconds": w} for r, w in enumerate(walls, 1)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        (folder / "checkpoint.pt").write_bytes(b"")
        if finished:
            (folder / "summary.json").write_text("{}")
        return folder

    run_folder("fedavg-s7", 500, [9.0, 11.0, 10.0, 10.0])
    held = run_folder("fednlr-s7", 200, [20.0] * 30)
    run_folder("feddyn-s7", 200, [15.0] * 200, finished=True)
    (out / ".units").mkdir()
    (out / ".units" / "next").write_text("3\n")
    env = {**os.environ, "FEDSUITE": str(Path(sys.executable).parent / "fedsuite")}

    def status() -> list[str]:
        done = subprocess.run(["bash", str(ROOT / "experiments" / "claims.sh"), "cifar10", "status", str(out)],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.splitlines()

    with hold.claimed(held):
        lines = status()
    runs = [line for line in lines if line.startswith(("running", "waiting"))]
    assert runs == ["waiting  fednlr/claims-c10n20-dir0.3/fedavg-s7: round 4 of 500, 10.0 s a round, about 83 min left",
                    "running  fednlr/claims-c10n20-dir0.3/fednlr-s7: round 30 of 200, 20.0 s a round, about 57 min left"]
    units = lines[len(runs):]
    left, total, first = re.fullmatch(r"units not yet taken: (\d+) of (\d+) \(next: (\S+)\)", units[0]).groups()
    assert int(total) - int(left) == 3 and int(left) == len(units) - 1 and units[1] == f"  {first}"
    # nothing holds a folder now: no run is going on, and the waiting runs are still listed
    lines = status()
    assert [line.split()[0] for line in lines[:2]] == ["waiting", "waiting"]
    assert lines[2] == f"no run is going on in {out}"


def test_every_committed_claims_record_is_the_run_its_target_asks_for(targets, tmp_path):
    """The records ``experiments/claims.sh`` commits (and copies back into a fresh ``--output-dir`` before
    it queues) were run under another ``--output-dir`` and ``--data-root``: they are still the runs their
    targets ask for, so the queue skips them. A failed one is named at the start, with the round
    and the reason its summary.json records, and how to run it again."""
    failed = []
    for name in ("fedmrur-claims", "fednlr-claims", "fedinit-claims", "fedmr-claims"):
        target = targets[name]
        records = ROOT / "experiments" / target.paper_key / "results" / "claims-cpu" / "runs"
        specs = [s for s in plan(target, "cpu", tmp_path / "out")
                 if (records / s.row.setting / s.run_dir.name / "config.json").is_file()]
        assert specs, name
        for spec in specs:
            shutil.copytree(records / spec.row.setting / spec.run_dir.name, spec.run_dir)
            assert json.loads((spec.run_dir / "config.json").read_text())["output_dir"] != str(spec.run_dir.parent)
        check_recorded(specs, "REMEDY")
        failed += [s for s in specs if rundir.state(s.run_dir, s.rounds) == "failed"]
    assert failed  # FedMR diverged at momentum 0.9 (docs/methods/fedmr.md)
    for retry_failed, then in ((False, "not run again; --retry-failed runs it again from its last checkpoint"),
                               (True, "run again (--retry-failed), from its last checkpoint")):
        console = Console(file=io.StringIO(), width=80)
        name_failed(failed, retry_failed, console)
        lines = console.file.getvalue().splitlines()
        assert len(lines) == len(failed)
        for spec, line in zip(failed, lines):
            summary = json.loads((spec.run_dir / "summary.json").read_text())
            assert line == (f"{spec.label}: failed, stopped after round {summary['rounds_completed']}: "
                            f"{summary['failure']['message']} ({spec.run_dir}); {then}")


def test_reproduce_reuses_a_moved_run_and_stops_on_a_changed_target(simulate, data_root, tmp_path):
    """A completed run of the target's one cell, moved into the target's folder (its record names
    another output_dir and run_name, and another engine: the in-process one, where the queue asks
    Flower's): the queue reuses it and runs nothing. The
    target replaced by a tables file of the same paper (``--tables``) whose row sets another alpha:
    the queue, and ``--report``, stop in one line naming the run folder and the field, exit 2, and
    write nothing (today's code read the old run as the new target's)."""
    from typer.testing import CliRunner

    from fedsuite.cli.main import app

    # the cell's data: the benchmark as it comes
    done = simulate(strategy="fedavg", dataset_options={}, engine="inprocess")
    tiny = TINY.format(dataset="synthetic").replace(', "faults.delay_s=1.0"', "")
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(tiny)
    out = tmp_path / "out"
    run_dir = out / "tiny" / "paper" / "dir0.5" / f"fedavg-s{FAST['seed']}"
    shutil.copytree(done.run_dir, run_dir, ignore=shutil.ignore_patterns(".flwr"))
    args = ["reproduce", "tiny", "--scale", "paper", "--tables", str(tables), "--output-dir", str(out), "--methods", "fedavg",
            "--seeds", str(FAST["seed"]), "--data-root", str(data_root)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "1 runs, 1 already done, 0 to run" in res.stdout and "start" not in res.stdout, res.stdout
    (row,) = csv.DictReader((out / "tiny" / "paper" / "tiny" / "report.csv").open())
    assert (row["method"], row["seeds_completed"]) == ("fedavg", "1")

    before = tree_snapshot(out)
    changed = tmp_path / "mine" / "tiny" / "tables.toml"  # the paper's folder name: the same runs' folder
    changed.parent.mkdir(parents=True)
    changed.write_text(tiny.replace('set = ["alpha=0.5"]', 'set = ["alpha=0.1"]'))
    for extra in ([], ["--report"]):
        res = CliRunner().invoke(app, [*args, "--tables", str(changed), *extra])
        assert res.exit_code == 2, res.stdout + res.stderr
        assert res.stdout == "" and res.stderr == (
            f"error: {run_dir.resolve()} holds a run of another config (alpha: recorded 0.5, asked 0.1); nothing was "
            "started: ask for the recorded config, or give the new runs another folder (another --output-dir)\n"), res.stderr
        assert tree_snapshot(out) == before


@pytest.mark.long
def test_raising_a_targets_rounds_continues_its_completed_runs(tmp_path):
    """A target run at 2 rounds, then asked for 3: the queue continues the completed run from its
    round 2 (``extend``), and the result is the 3-round run started afresh, bit for bit. Asked for
    1 round, the run is named as longer than asked, left untouched, and the command exits 1."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tiny = TINY.format(dataset="synthetic").replace(', "faults.delay_s=1.0"', "")
    common = ["--tables", str(tables), "--data-root", str(tmp_path / "data"), "--methods", "fedavg", "--seeds", "0",
              "--engine", "inprocess"]

    def reproduce(rounds: int, out: Path) -> subprocess.CompletedProcess:
        tables.write_text(tiny.replace('"rounds=2"', f'"rounds={rounds}"'))
        return fedsuite_run(["reproduce", "tiny", "--scale", "paper", "--output-dir", str(out), *common], env=_env(), timeout=900)

    out, ref_out = tmp_path / "out", tmp_path / "reference"
    run, reference = (o / "tiny" / "paper" / "dir0.5" / "fedavg-s0" for o in (out, ref_out))
    assert reproduce(2, out).returncode == 0
    assert [r["round"] for r in read_metrics(run)] == [0, 1, 2]
    more = reproduce(3, out)
    assert more.returncode == 0, more.stdout + more.stderr
    assert "extend dir0.5 fedavg s0" in more.stdout, more.stdout
    assert reproduce(3, ref_out).returncode == 0
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]  # noqa: E731
    assert [r["round"] for r in read_metrics(run)] == [0, 1, 2, 3]
    assert strip(read_metrics(run)) == strip(read_metrics(reference))
    assert_same_arrays(torch.load(run / "checkpoint.pt", weights_only=False)["arrays"],
                       torch.load(reference / "checkpoint.pt", weights_only=False)["arrays"])
    assert json.loads((run / "config.json").read_text())["rounds"] == 3

    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    fewer = reproduce(1, out)
    assert fewer.returncode == 1, fewer.stdout + fewer.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert "- fedavg seed 0: has 3 rounds, more than the 1 asked" in (out / "tiny/paper/tiny/report.md").read_text()


CLAIMS_TARGETS = ("fedmrur-claims", "fednlr-claims", "fedinit-claims", "fedmr-claims")


#: the CPU test's share of the claims targets: one claim's two methods on each paper-scale model
#: and dataset (FedMRUR and FedMRUR-N on ResNet-18-GN / CIFAR-100; FedDyn with and without
#: neuron-wise rates on VGG-9 / CIFAR-10); every cell config is built by test_every_cell_builds_a_config,
#: and the GPU test runs every cell of every claims target
ONE_CLAIM_EACH = {"fedmrur-claims": ["fedmrur", "fedmrur-n"], "fednlr-claims": ["feddyn", "feddyn-nlr"]}


def run_claims_at_paper_scale(tmp_path: Path, placement: list[str],
                              methods: dict[str, list[str]] | None = None) -> list[tuple[Target, list]]:
    """The claims targets at ``--scale paper`` (ResNet-18-GN, VGG-9 and FedMR's CNN on CIFAR-10/100,
    each paper's recipe), every cell shrunk to 4 clients, 2 per round, 1 round of 1 epoch, on
    generated CIFAR-10/100 files in torchvision's format, one seed, two runs at a time; ``methods``:
    only these columns per target (default: all). Returns each target with its runs, after checking
    that every run completed and the report judged each claim on what ran."""
    data = tmp_path / "data"
    make_cifar10(data, per_batch=20)
    make_cifar100(data)
    shrink = ["num_clients=4", "clients_per_round=2", "rounds=1", "local_epochs=1", "batch_size=5", "eval_every=1",
              "min_partition_size=1"]
    targets = load_targets()
    planned = []
    for name in CLAIMS_TARGETS if methods is None else list(methods):
        target = targets[name]
        # row.method_set comes last at paper scale, after every other override of a cell
        target = dataclasses.replace(target, rows=[
            dataclasses.replace(r, method_set={m: [*r.method_set.get(m, []), *shrink] for m in target.methods})
            for r in target.rows])
        specs = plan(target, "paper", tmp_path / "out", seeds=[0], data_root=str(data),
                     methods=None if methods is None else methods[name])
        # the data check: nothing missing here, every CIFAR file named where the folder is empty
        assert missing_data(specs) == [], name
        assert "data_batch_1" in " ".join(missing_data(
            plan(targets["fedinit-claims"], "paper", tmp_path / "none", seeds=[0],
                 data_root=str(tmp_path / "empty"))))
        planned.append((target, specs))
    every = [s for _, specs in planned for s in specs]
    states = run_queue(every, jobs=2, placement=placement, console=Console(file=io.StringIO()))
    assert states == {s.run_dir: "completed" for s in every}, {s.label: states[s.run_dir] for s in every}
    shares = {len(cores) for cores in core_slices(2) or [range(available_cores())]}
    for target, specs in planned:
        for s in specs:  # the paper's model and dataset ran, not a CPU stand-in, on its share of the cores
            assert json.loads((s.run_dir / "summary.json").read_text())["timing"]["cores"] in shares, s.label
            cfg = json.loads((s.run_dir / "config.json").read_text())
            assert (cfg["model"], cfg["dataset"]) in {("resnet18-gn", "cifar100"), ("vgg9", "cifar10"),
                                                      ("resnet18-gn", "cifar10"), ("cnn", "cifar10")}, s.label
        md = write_report(target, specs, "paper", tmp_path / "reports" / target.name).read_text()
        claimed = list(csv.DictReader((tmp_path / "reports" / target.name / "claims.csv").open()))
        ran = {s.method for s in specs}
        assert [(c["better"], c["worse"]) for c in claimed] == [p for r in target.rows if r.name in
                                                                 {s.row.name for s in specs} for p in r.claims]
        # one seed: a difference where both sides ran, and no verdict without a standard error
        for c in claimed:
            assert c["seeds_paired"] == ("1" if {c["better"], c["worse"]} <= ran else "0"), c
            # one seed judges nothing; a component that did not act in the one round is said so,
            # with its measure (FedMRUR's regulariser after one tiny round)
            if c["verdict"] == INERT_HERE:
                assert c["component"] and float(c["activity_value"]) < float(c["activity_threshold"]), c
            else:
                assert c["verdict"] == NOT_JUDGED, c
        assert "Runs that did not complete" not in md
    return planned


@pytest.mark.long
@pytest.mark.xdist_group("claims-at-paper-scale")  # beside this file's other long test, not after it
def test_the_claims_targets_run_at_paper_scale_on_generated_cifar(tmp_path):
    planned = run_claims_at_paper_scale(tmp_path, ["--engine", "inprocess"], ONE_CLAIM_EACH)
    assert sum(len(specs) for _, specs in planned) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible: the GPU tests need one")
def test_two_claims_runs_share_one_gpu(tmp_path):
    """``--jobs 2 --num-gpus 0.5``: every cell of every claims target, two simulations at once on one
    GPU, each on its private Ray, all completed; at least two runs' lifetimes overlap."""
    planned = run_claims_at_paper_scale(tmp_path, placement_options(0.5, None))
    spans = []
    for _, specs in planned:
        for s in specs:
            summary = json.loads((s.run_dir / "summary.json").read_text())
            assert json.loads((s.run_dir / "config.json").read_text())["num_gpus"] == 0.5
            start = summary["timing"]["serverapp_start"]
            spans.append((start, start + summary["total_seconds"]))
    spans.sort()
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans


def test_the_difference_over_rounds_ends_at_the_verdicts_reading():
    """``difference_over_rounds``: at the last round its mean and half-width are the verdict's d̄ and
    h from the runs' values (the mean of the last ``last`` evaluations); at every round r they are
    the same reading of the runs cut at r; rounds start where ``last`` evaluations exist in both runs
    of every pair (round 0 left out, an unevaluated round skipped)."""
    rng = np.random.default_rng(3)
    last, pairs = 3, []
    for _ in range(4):
        pair = []
        for shift in (0.02, 0.0):
            rows = [{"round": 0, "test_accuracy": 0.1}]
            rows += [{"round": r, "test_accuracy": None if r == 5 else float(min(1.0, 0.1 + 0.01 * r + shift
                                                                                 + rng.normal(0, 0.01)))}
                     for r in range(1, 13)]
            pair.append(rows)
        pairs.append(tuple(pair))

    def values(rows, upto):
        evals = [(r["round"], r["test_accuracy"]) for r in rows if 0 < r["round"] <= upto and r["test_accuracy"] is not None]
        return run_value(evals, "accuracy", last)[0]

    curve = difference_over_rounds(pairs, last, 0.95)
    assert curve.rounds == [3, 4, 6, 7, 8, 9, 10, 11, 12]  # from the third evaluation on; 5 was not evaluated
    for i, upto in enumerate(curve.rounds):
        diffs = [values(b, upto) - values(w, upto) for b, w in pairs]
        verdict = paired_verdict(diffs, 2.0, confidence=0.95)
        assert curve.per_seed[:, i] == pytest.approx(diffs, abs=1e-9)
        assert curve.mean[i] == pytest.approx(verdict.mean, abs=1e-9)
        assert curve.half_width[i] == pytest.approx(verdict.half_width, abs=1e-9)
    assert difference_over_rounds(pairs[:1], last).half_width is None  # one seed: no interval
    assert difference_over_rounds([(pairs[0][0][:3], pairs[0][1])], last) is None  # fewer evaluations than `last`
