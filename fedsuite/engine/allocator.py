"""glibc malloc's settings for a process that trains or evaluates models on the CPU.

glibc serves a request larger than its mmap threshold with fresh pages from the kernel (mmap) and
hands them back on free. The threshold starts at 128 KiB and only grows to the largest such block
freed so far; the heap's trim threshold (twice it) hands a freed top of the heap back as soon as
it is larger. A CPU forward pass allocates activations of megabytes (Fashion-MNIST's ``cnn``:
19 MB a conv output at a batch of 256), so every batch can map, zero-fill and unmap new pages.
Measured on a 2-core "AMD EPYC" (2026-12-07), three central evaluations of 10,000 images at a
batch of 256: 496,000 page faults, 0.93 s of kernel time and 0.54-0.60 s each; with :func:`tune`,
358 faults and 0.38 s each. A FedAvg round of ``benchmarks/overhead.py`` (in-process engine) went
from 0.90-1.00 s to 0.69-0.75 s.

:func:`tune` fixes both thresholds (``mallopt``): blocks up to :data:`MMAP_THRESHOLD` (32 MiB,
the largest glibc takes) come from the heap, and a heap keeps up to :data:`TRIM_THRESHOLD`
(256 MiB) of freed memory for the next batch instead of handing it back. The cost is memory: each
malloc arena (one per thread that allocates) may hold that much freed memory. PyTorch's CPU
performance guide suggests another allocator (jemalloc, tcmalloc) for the same reason; this keeps
glibc and needs no package. Where the C library is not glibc (macOS, musl), :func:`tune` changes
nothing and says so. Numbers are unchanged: it moves no arithmetic, only where memory comes from.

The round engine (``fedsuite.engine.round_engine.execute``: the ServerApp of either engine, and
the in-process engine's clients) and the ClientApp (a Flower client process) call it once per
process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger("fedsuite")

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap: glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
MMAP_THRESHOLD = 32 << 20
#: a heap hands freed memory back to the kernel only above this much at its top
TRIM_THRESHOLD = 256 << 20

_lock = threading.Lock()
_result: bool | None = None


def tune() -> bool:
    """Set :data:`MMAP_THRESHOLD` and :data:`TRIM_THRESHOLD` in this process's glibc, once (see
    module); True if they are set, False where the C library is not glibc or refused them (logged
    once, at debug level: nothing is wrong, the process only runs as PyTorch does by default)."""
    global _result
    with _lock:
        if _result is None:
            _result = _mallopt()
        return _result


def _mallopt() -> bool:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (musl and macOS have a mallopt of another meaning or none)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        log.debug("malloc thresholds unchanged: the C library (%s) is not glibc", name)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.debug("malloc thresholds: glibc refused them")
    return ok
