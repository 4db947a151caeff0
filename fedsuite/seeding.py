"""The one seeding convention: every random draw comes from a generator seeded by integers
(run seed, ..., purpose tag), each taken modulo 2^32, so a draw depends only on *what* it is for
and *when* (the global round), never on what ran before it. A resumed run therefore repeats
exactly the draws of an uninterrupted one.

* :func:`seed_for` (torch and client work): a 63-bit seed from (seed, partition id, round, ...);
* :func:`round_rng` (server draws): a numpy generator for (seed, round, tag).

Purpose tags are constants beside the code that draws (``COHORT_TAG`` here, ``SLOT_TAG`` in
``strategies/pool.py``, ...).
"""

from __future__ import annotations

import numpy as np

#: the cohort sample of a round (``FedSuiteStrategy.sample_cohort``)
COHORT_TAG = 0x5EED


def _words(parts) -> list[int]:
    return [int(p) & 0xFFFFFFFF for p in parts]


def seed_for(*parts: int) -> int:
    """A 63-bit seed derived from integers (seed, partition id, round, ...), stable across runs."""
    return int(np.random.SeedSequence(_words(parts)).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)


def round_rng(seed: int, server_round: int, tag: int) -> np.random.Generator:
    """A generator determined by (seed, global round, purpose tag)."""
    return np.random.default_rng(_words((seed, server_round, tag)))
