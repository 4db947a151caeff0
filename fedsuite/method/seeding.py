"""The one seeding convention: every random draw comes from a generator seeded by integers
(run seed, ..., purpose tag), each taken modulo 2^32, so a draw depends only on *what* it is for
and *when* (the global round), never on what ran before it. A resumed run therefore repeats
exactly the draws of an uninterrupted one.

* :func:`seed_for` (torch and client work): a 63-bit seed from (seed, partition id, round, ...);
* :func:`round_rng` (server draws): a numpy generator for (seed, round, tag).

Purpose tags are constants beside the code that draws (``COHORT_TAG`` here, ``SLOT_TAG`` in
``strategies/pool.py``, ...).

torch's global RNG is one per process, and the in-process engine trains a round's clients on
parallel threads (``fedsuite.engine.transport.InProcessTransport``). Client work therefore draws from its
own ``torch.Generator``; what does use the global RNG (a model's dropout, a module's default
initialisation, a section under ``torch.random.fork_rng``) holds :data:`GLOBAL_TORCH_RNG` while it
seeds and draws (:func:`global_seed`), so no thread moves another's stream.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch

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


#: held by whatever seeds or draws from torch's process-wide RNG while other threads may train
#: (re-entrant: a holder may call code that takes it again)
GLOBAL_TORCH_RNG = threading.RLock()


@contextmanager
def global_seed(seed: int, draws: bool) -> Iterator[None]:
    """``torch.manual_seed(seed)`` for the block: the process-wide RNG (CPU and CUDA) starts from
    ``seed``, as in a client's own process. ``draws``: the block draws from it (a model with
    dropout), so :data:`GLOBAL_TORCH_RNG` is held for the whole block and such blocks run one at a
    time; otherwise only while seeding."""
    GLOBAL_TORCH_RNG.acquire()
    held = True
    try:
        torch.manual_seed(seed)
        if not draws:
            GLOBAL_TORCH_RNG.release()
            held = False
        yield
    finally:
        if held:
            GLOBAL_TORCH_RNG.release()
