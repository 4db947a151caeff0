"""The verdicts of the orderings a paper claims, judged on differences paired by seed.

Per row of a target, each ordering the paper claims (a row's ``claims``, else read off its
published numbers: :func:`claims`) is judged on the per-seed differences of the two methods' run
values over the seeds where both runs completed (:func:`paired_verdict`): **holds**, **within
noise**, **reversed** or **not judged** (:data:`VERDICT_RULE` is how the report states the rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

#: how the report states the rule (:func:`paired_verdict`)
VERDICT_RULE = (
    "Verdict of each ordering the paper claims: the difference of the reading between the two methods is "
    "taken per seed (a seed fixes the partition, the cohorts and the initial model) over the seeds where both "
    "runs completed; **holds** if its mean exceeds two standard errors (sample sd / √n) in the paper's "
    "direction, **reversed** if it does so in the other direction, **within noise** otherwise; **not judged** "
    "with fewer than two paired seeds. A run that failed is left out and named under its row.")

#: the verdicts of one claimed ordering (:func:`paired_verdict`)
HOLDS, WITHIN_NOISE, REVERSED, NOT_JUDGED = "holds", "within noise", "reversed", "not judged"
VERDICTS = (HOLDS, WITHIN_NOISE, REVERSED, NOT_JUDGED)


def paired_verdict(differences: Sequence[float]) -> tuple[float | None, float | None, str]:
    """(mean, standard error, verdict) of a claimed ordering from its per-seed differences
    d_s = v_better(s) − v_worse(s), signed so that d_s > 0 agrees with the paper:

        d̄ = (1/n) Σ_s d_s,   SE = sd(d) / √n  with sd the sample standard deviation (n − 1),

    and the verdict ``holds`` if d̄ > 2·SE, ``reversed`` if d̄ < −2·SE, ``within noise`` otherwise.
    With fewer than two paired seeds there is no standard error: ``not judged`` (d̄ is still given
    for one seed). A seed fixes the partition, the cohorts and the initial model, so pairing by seed
    removes the part of the spread that both methods share."""
    d = np.asarray(list(differences), dtype=float)
    if d.size == 0:
        return None, None, NOT_JUDGED
    mean = float(d.mean())
    if d.size < 2:
        return mean, None, NOT_JUDGED
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    return mean, se, HOLDS if mean > 2 * se else REVERSED if mean < -2 * se else WITHIN_NOISE


@dataclass
class Claim:
    """One ordering the paper claims: ``better`` beat ``worse``. ``differences``: per seed where both
    runs completed, better's value minus worse's in the direction the paper calls better (in %
    points, or rounds saved for a rounds-to-target table)."""

    better: str
    worse: str
    differences: dict[int, float] = field(default_factory=dict)

    @property
    def result(self) -> tuple[float | None, float | None, str]:
        """(mean difference, standard error, verdict): :func:`paired_verdict`."""
        return paired_verdict([self.differences[s] for s in sorted(self.differences)])

    @property
    def verdict(self) -> str:
        return self.result[2]


def claims(published: dict[str, float], obtained: dict[str, dict[int, float]], pairs: Sequence[tuple[str, str]],
           higher_is_better: bool = True, stated: Sequence[tuple[str, str]] | None = None) -> list[Claim]:
    """The orderings to judge and their per-seed differences. ``obtained``: method -> {seed: run
    value} of the completed runs. The orderings are ``stated`` ((better, worse) pairs, as a claims
    row names them) or, when None, read off the published numbers: for each pair (a, b) with both
    published and not tied there, "a beats b" or "b beats a" as the paper has it. A run value of
    ``inf`` (never reached a rounds target) is the caller's to censor before."""
    sign = 1 if higher_is_better else -1
    if stated is None:
        stated = []
        for a, b in pairs:
            if a in published and b in published and published[a] != published[b]:
                stated.append((a, b) if sign * (published[a] - published[b]) > 0 else (b, a))
    out = []
    for better, worse in stated:
        vb, vw = obtained.get(better, {}), obtained.get(worse, {})
        out.append(Claim(better, worse, {s: sign * (vb[s] - vw[s]) for s in sorted(vb) if s in vw}))
    return out


def verdict(row_claims: Sequence[Claim]) -> str:
    """A row's claims in one phrase: how many got each verdict (``2 hold, 1 within noise``), or
    ``no claim``."""
    if not row_claims:
        return "no claim"
    counts = {v: sum(1 for c in row_claims if c.verdict == v) for v in VERDICTS}
    return ", ".join(f"{n} {'hold' if v == HOLDS and n > 1 else v}" for v, n in counts.items() if n)
