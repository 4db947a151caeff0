"""The verdicts of the orderings a paper claims, judged on differences paired by seed and weighed
against the paper's own difference.

Per row of a target, each ordering the paper claims (a row's ``claims``, else read off its
published numbers: :func:`claims`) is judged on the per-seed differences of the two methods' run
values over the seeds where both runs completed, and on the paper's difference for that cell (its
published numbers, or the nearest published cell the row names: ``paper_differences`` in the
tables file). :func:`paired_verdict` gives one of :data:`VERDICTS`: **holds**, **reversed**,
**could not tell**, **smaller than the paper's**, **inert here**, **not judged**, deciding with the
two-sided paired t-interval at a stated confidence (:data:`DEFAULT_CONFIDENCE`, 95%);
:func:`verdict_rule` is how the report states the rule. A new verdict is one more constant in :data:`VERDICTS` (the
report's columns and a row's summary follow that tuple) and one more branch in :func:`paired_verdict`.

**inert here**: where a row names the component that distinguishes an ordering (its ``components``
field: FedMRUR's hyperbolic regulariser for FedMRUR > FedMRUR-N) and the better method's runs
recorded that component acting below its threshold (``fedsuite.method.activity``: each run's mean of the
measure over its rounds, averaged over the paired seeds, :class:`Activity`), the ordering compares
the method with itself, so its outcome was settled before the runs: no judgement is made. Runs
recorded before activity was measured give "activity not recorded" and are judged as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from fedsuite.method.activity import Component

#: the confidence of the verdicts' intervals unless a caller names another (``reproduce --confidence``)
DEFAULT_CONFIDENCE = 0.95


def check_confidence(confidence: float) -> float:
    """``confidence`` if it is a probability strictly between 0 and 1; ValueError otherwise."""
    if not 0.0 < float(confidence) < 1.0:  # NaN too
        raise ValueError(f"the confidence must lie strictly between 0 and 1, got {confidence!r}")
    return float(confidence)


def t_quantile(confidence: float, n: int) -> float:
    """The two-sided critical value of Student's t for ``n`` paired seeds: the
    (1 + confidence)/2 quantile of t with n − 1 degrees of freedom (4.30 for 3 seeds at 0.95, 2.78
    for 5). ValueError for n < 2 (no degree of freedom)."""
    if n < 2:
        raise ValueError(f"a t interval needs at least two paired seeds, got {n}")
    from scipy.stats import t  # scipy is slow to import: only where a verdict is computed

    return float(t.ppf((1.0 + check_confidence(confidence)) / 2.0, n - 1))


def verdict_rule(confidence: float = DEFAULT_CONFIDENCE) -> str:
    """How a report states the rule of :func:`paired_verdict` at ``confidence``."""
    pct = f"{100 * check_confidence(confidence):g}%"
    return (
        "Verdict of each ordering the paper claims, at " + pct + " confidence: the difference of the reading "
        "between the two methods is taken per seed (a seed fixes the partition, the cohorts and the initial model) "
        "over the n seeds where both runs completed, signed so that a positive difference agrees with the paper; d̄ "
        "is its mean, SE its standard error (sample sd, n − 1 in the denominator, / √n) and I = [d̄ − h, d̄ + h] its "
        f"two-sided {pct} paired t-interval, h = t·SE with t the {(1 + confidence) / 2:g} quantile of Student's t "
        "with n − 1 degrees of freedom (h is the smallest difference these seeds could detect). D is the paper's "
        "difference for the same cell (its published numbers, better minus worse; where the cell is not published, "
        "the nearest cell of the paper's tables, named under the row). **holds** if I lies above 0 (d̄ − h > 0); "
        "**reversed** if I lies below 0 (d̄ + h < 0); otherwise 0 lies in I and the verdict says whether the "
        "paper's difference does too: **could not tell** if D ≤ d̄ + h (these runs cannot tell the paper's "
        "difference from none), **smaller than the paper's** if D > d̄ + h (a difference of the paper's size would "
        "have shown; any here is smaller); **not judged** with fewer than two paired seeds. **inert here**, instead "
        "of any of these, where the row names the component that distinguishes the ordering (the better method's "
        "own: FedMRUR's hyperbolic regulariser, relaxed initialisation, neuron-wise learning rates) and the better "
        "method's runs recorded it acting less than its threshold (its activity measure's mean over each run's "
        "rounds, averaged over the paired seeds; the measure and its value are shown beside the ordering): the two "
        "methods then ran the same training, so the ordering was settled before the runs. Runs recorded before "
        "activity was measured say **activity not recorded** and are judged as above. A run that failed is left "
        "out and named under its row.")


#: the verdicts of one claimed ordering (:func:`paired_verdict`), in the order the report lists them
HOLDS, REVERSED = "holds", "reversed"
COULD_NOT_TELL, SMALLER_THAN_PAPERS = "could not tell", "smaller than the paper's"
INERT_HERE, NOT_JUDGED = "inert here", "not judged"
VERDICTS = (HOLDS, REVERSED, COULD_NOT_TELL, SMALLER_THAN_PAPERS, INERT_HERE, NOT_JUDGED)
#: what the report says of an ordering whose component's activity its runs do not record
ACTIVITY_NOT_RECORDED = "activity not recorded"
#: a verdict's word after a count above one, where it differs (``2 hold``)
PLURALS = {HOLDS: "hold"}


class PairedResult(NamedTuple):
    """A claimed ordering's numbers and verdict (:func:`paired_verdict`): the mean paired
    difference d̄, its standard error SE, the half-width h of its t-interval (None, each, where
    there are too few seeds) and the verdict."""

    mean: float | None
    se: float | None
    half_width: float | None
    verdict: str


def paired_verdict(differences: Sequence[float], paper_difference: float,
                   activity: tuple[float, float] | None = None,
                   confidence: float = DEFAULT_CONFIDENCE) -> PairedResult:
    """The verdict of a claimed ordering from its per-seed differences d_s = v_better(s) −
    v_worse(s), signed so that d_s > 0 agrees with the paper, the paper's difference D > 0 for the
    same cell (same sign convention: points gained, or rounds saved) and, where the ordering is
    distinguished by a component whose activity the runs recorded, ``activity`` = (a, θ): the
    better method's measure a (mean over rounds and paired seeds, :class:`Activity`) and the
    component's threshold θ. With n paired seeds and c = ``confidence``:

        d̄ = (1/n) Σ_s d_s,   SE = sd(d) / √n  (sd: the sample standard deviation, n − 1),
        h = t_{(1+c)/2, n−1} · SE,   I = [d̄ − h, d̄ + h]   (the two-sided paired t-interval)

    and

        holds                     if d̄ − h > 0            (I lies above 0)
        reversed                  if d̄ + h < 0            (I lies below 0)
        could not tell            if 0 ∈ I and D ≤ d̄ + h  (D ∈ I: neither 0 nor D is ruled out)
        smaller than the paper's  if 0 ∈ I and D > d̄ + h  (D is ruled out, 0 is not)

    (0 ∈ I and D > 0 give D ≥ d̄ − h, so those four cases are all.) Before any of them:

        inert here                if a < θ                (the component did not act: no judgement)

    (d̄, SE and h are still given). With fewer than two paired seeds there is no standard error:
    ``not judged`` (d̄ is still given for one seed), unless inert. SE = 0 makes I the single point
    d̄. A seed fixes the partition, the cohorts and the initial model, so pairing by seed removes
    the part of the spread that both methods share. Raises ValueError if D is not > 0 (a claim the
    paper makes goes its own way: :func:`paper_difference`) or c is not in (0, 1)."""
    if not paper_difference > 0:  # NaN too
        raise ValueError(f"the paper's difference must be > 0 in the paper's direction, got {paper_difference!r}")
    check_confidence(confidence)
    d = np.asarray(list(differences), dtype=float)
    if d.size == 0:
        return PairedResult(None, None, None, NOT_JUDGED)
    mean = float(d.mean())
    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size >= 2 else None
    half = None if se is None else t_quantile(confidence, d.size) * se
    if activity is not None and activity[0] < activity[1]:
        return PairedResult(mean, se, half, INERT_HERE)
    if half is None:
        return PairedResult(mean, None, None, NOT_JUDGED)
    if mean - half > 0:
        word = HOLDS
    elif mean + half < 0:
        word = REVERSED
    else:
        word = COULD_NOT_TELL if paper_difference <= mean + half else SMALLER_THAN_PAPERS
    return PairedResult(mean, se, half, word)


def paper_difference(published: Mapping[str, float], better: str, worse: str,
                     higher_is_better: bool = True) -> float | None:
    """The paper's difference of "better beats worse" from its published numbers, in the
    direction the paper calls better: published[better] − published[worse] (points), or
    published[worse] − published[better] for a lower-is-better metric (rounds saved; ``inf`` where
    worse never reached the target). None unless both are published."""
    if better not in published or worse not in published:
        return None
    return _gain(published[better], published[worse], higher_is_better)


def _gain(better: float, worse: float, higher_is_better: bool) -> float:
    """better − worse, or worse − better where lower is better (no −0.0 for a tie)."""
    return better - worse if higher_is_better else worse - better


@dataclass
class Activity:
    """How much the component that distinguishes a claimed ordering acted in the better method's
    runs (``fedsuite.method.activity``): ``per_seed`` maps each paired seed to its run's mean of the
    component's measure over its rounds (``summary.json``'s ``activity``), or None where the run
    recorded none (made before activity was measured)."""

    component: Component
    per_seed: dict[int, float | None] = field(default_factory=dict)

    @property
    def unrecorded(self) -> list[int]:
        """The paired seeds whose run recorded no activity for the component."""
        return sorted(s for s, v in self.per_seed.items() if v is None)

    @property
    def value(self) -> float | None:
        """The mean of the runs' activity over the paired seeds; None without a paired seed or
        when one of them recorded none (the ordering is then judged as before)."""
        if not self.per_seed or self.unrecorded:
            return None
        return float(np.mean([self.per_seed[s] for s in sorted(self.per_seed)]))

    @property
    def inert(self) -> bool:
        """value < threshold: the component did not act in these runs."""
        return self.value is not None and self.value < self.component.threshold

    def describe(self) -> str:
        """One phrase for the report: ``fedmrur-hyperbolic-share 5.1e-07 < 0.001 (inert)``,
        ``neuron-lr-spread 0.14 ≥ 0.001``, ``activity not recorded`` (naming the seeds where only
        some recorded none), or ``-`` without a paired run."""
        c = self.component
        if not self.per_seed:
            return "-"
        if self.unrecorded:
            some = "" if len(self.unrecorded) == len(self.per_seed) else \
                f" (seed{'s' if len(self.unrecorded) > 1 else ''} {', '.join(map(str, self.unrecorded))})"
            return ACTIVITY_NOT_RECORDED + some
        value = self.value
        return f"{c.measure} {value:.2g} < {c.threshold:g} (inert)" if self.inert else \
            f"{c.measure} {value:.2g} ≥ {c.threshold:g}"


@dataclass
class Claim:
    """One ordering the paper claims: ``better`` beat ``worse``. ``paper_difference``: the paper's
    difference for this cell (> 0, :func:`paper_difference`); ``paper_source``: where it comes
    from when not from the row's own published numbers (the nearest cell of the paper's tables),
    empty otherwise. ``differences``: per seed where both runs completed, better's value minus
    worse's in the direction the paper calls better (in % points, or rounds saved for a
    rounds-to-target table). ``activity``: where the row names the component that distinguishes
    this ordering, how much it acted in better's runs over the paired seeds; None otherwise.
    ``confidence``: the level of the t-interval the verdict is decided with."""

    better: str
    worse: str
    paper_difference: float
    differences: dict[int, float] = field(default_factory=dict)
    paper_source: str = ""
    activity: Activity | None = None
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def result(self) -> PairedResult:
        """:func:`paired_verdict` at this claim's confidence, with the recorded activity and its
        threshold where there is one."""
        a = self.activity
        measured = None if a is None or a.value is None else (a.value, a.component.threshold)
        return paired_verdict([self.differences[s] for s in sorted(self.differences)], self.paper_difference, measured,
                              self.confidence)

    @property
    def verdict(self) -> str:
        return self.result.verdict


def claims(published: Mapping[str, float], obtained: Mapping[str, Mapping[int, float]],
           pairs: Sequence[tuple[str, str]], higher_is_better: bool = True,
           stated: Sequence[tuple[str, str]] | None = None,
           nearest: Mapping[tuple[str, str], tuple[float, str]] | None = None,
           components: Mapping[tuple[str, str], Component] | None = None,
           activity: Mapping[str, Mapping[int, Mapping[str, float]]] | None = None,
           confidence: float = DEFAULT_CONFIDENCE) -> list[Claim]:
    """The orderings to judge, their per-seed differences and the paper's difference of each.
    ``obtained``: method -> {seed: run value} of the completed runs. The orderings are ``stated``
    ((better, worse) pairs, as a claims row names them) or, when None, read off the published
    numbers: for each pair (a, b) with both published and not tied there, "a beats b" or "b beats
    a" as the paper has it. The paper's difference of each is read off ``published``
    (:func:`paper_difference`), else taken from ``nearest`` ((better, worse) -> (difference,
    which cell of the paper's tables it comes from)); a stated ordering with neither raises
    ValueError (``parse_tables`` refuses such a row). A run value of ``inf`` (never reached a
    rounds target) is the caller's to censor before. ``components``: (better, worse) -> the
    component that distinguishes that ordering (a row's ``components``); ``activity``: method ->
    {seed: {component name: the run's mean of its measure over rounds}} of the completed runs that
    recorded activity (a seed absent: its run recorded none). A claim with a component gets its
    :class:`Activity` over the paired seeds. Every claim is judged at ``confidence``."""
    nearest, components, activity = nearest or {}, components or {}, activity or {}
    if stated is None:
        stated = []
        for a, b in pairs:
            if a in published and b in published and published[a] != published[b]:
                stated.append((a, b) if _gain(published[a], published[b], higher_is_better) > 0 else (b, a))
    out = []
    for better, worse in stated:
        paper, source = paper_difference(published, better, worse, higher_is_better), ""
        if paper is None:
            if (better, worse) not in nearest:
                raise ValueError(f"the claim {better} > {worse} has no paper's difference: neither both published "
                                 "nor a nearest cell given")
            paper, source = nearest[better, worse]
        vb, vw = obtained.get(better, {}), obtained.get(worse, {})
        paired = {s: _gain(vb[s], vw[s], higher_is_better) for s in sorted(vb) if s in vw}
        acted = None
        if (better, worse) in components:
            component = components[better, worse]
            recorded = activity.get(better, {})
            acted = Activity(component, {s: recorded.get(s, {}).get(component.name) for s in paired})
        out.append(Claim(better, worse, paper, paired, source, acted, check_confidence(confidence)))
    return out


def verdict(row_claims: Sequence[Claim]) -> str:
    """A row's claims in one phrase: how many got each verdict, in the order of :data:`VERDICTS`
    (``2 hold, 1 could not tell``), or ``no claim``."""
    if not row_claims:
        return "no claim"
    counts = {v: sum(1 for c in row_claims if c.verdict == v) for v in VERDICTS}
    return ", ".join(f"{n} {PLURALS.get(v, v) if n > 1 else v}" for v, n in counts.items() if n)


class DifferenceCurve(NamedTuple):
    """One ordering's paired difference over rounds (:func:`difference_over_rounds`)."""

    rounds: list[int]
    per_seed: np.ndarray  # seeds x rounds, in points
    mean: np.ndarray
    half_width: np.ndarray | None  # the t-interval's, None below two seeds


def difference_over_rounds(pairs: Sequence[tuple[Sequence[Mapping], Sequence[Mapping]]], last: int,
                           confidence: float = DEFAULT_CONFIDENCE, sign: float = 1.0) -> DifferenceCurve | None:
    """The verdict's reading taken at every round instead of only the last: for each paired seed
    ``(better's rows, worse's rows)`` (``metrics.jsonl``), at each round r evaluated in both runs,
    d_s(r) = sign · 100 · (mean of the better run's last ``last`` evaluations up to r − the same of the
    worse run's), in points; over the seeds, d̄(r) ± t·SE(r) as :func:`paired_verdict` takes it at
    the run's end. Rounds are those every pair has (round 0 left out); None where none is. A curve
    still moving at the last round says the verdict is one about that round, not about the method."""
    series = []
    for better, worse in pairs:
        acc = [{r["round"]: r["test_accuracy"] for r in rows if r.get("round", 0) > 0 and r.get("test_accuracy") is not None}
               for rows in (better, worse)]
        common = sorted(set(acc[0]) & set(acc[1]))
        if len(common) < last:
            return None
        diff = np.array([acc[0][r] - acc[1][r] for r in common]) * 100.0 * sign
        trailing = np.convolve(diff, np.ones(last) / last, mode="valid")  # mean of the last `last` evaluations
        series.append(dict(zip(common[last - 1:], trailing)))
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not rounds:
        return None
    per_seed = np.array([[s[r] for r in rounds] for s in series])
    mean = per_seed.mean(0)
    half = (t_quantile(confidence, len(series)) * per_seed.std(0, ddof=1) / math.sqrt(len(series))
            if len(series) > 1 else None)
    return DifferenceCurve(rounds, per_seed, mean, half)
