"""The files behind a dataset on disk: the one-line error when they are missing, the official
download (bounded in time), and the decoded copy kept under ``<root>/.fedsuite_cache``.

Loaders never extract or write inside a dataset folder they did not download themselves. When
files are missing they try the official download (torchvision, with its checksums) and, if that
fails (offline), raise :class:`DatasetError` naming the missing files and the expected layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .bundle import DatasetError

_DECODE_CACHE_VERSION = 1
_DOWNLOAD_TIMEOUT_S = 30.0


def _missing_error(
    name: str, missing: Sequence[Path], layout: str, reason: str | None = None
) -> DatasetError:
    shown = ", ".join(str(p) for p in list(missing)[:8])
    if len(missing) > 8:
        shown += f" and {len(missing) - 8} more"
    why = f" The automatic download failed ({reason})." if reason else ""
    return DatasetError(
        f"Dataset '{name}' could not be loaded: missing {shown}.{why} Expected layout: {layout} "
        "Download the files on a machine with internet access (or let fedsuite download them "
        "there) and copy them into place under the data root."
    )


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(old)


def _try_download(fn: Callable[[], Any]) -> str | None:
    """Run a download; return None on success or a one-line reason on failure."""
    try:
        with _socket_timeout(_DOWNLOAD_TIMEOUT_S):
            fn()
    except Exception as exc:  # noqa: BLE001 - any failure becomes a DatasetError upstream
        msg = " ".join(str(exc).split())
        if len(msg) > 300:
            msg = msg[:300] + "..."
        return f"{type(exc).__name__}: {msg}"
    return None


def _listing_key(files: Sequence[Path], extra: Any) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([_DECODE_CACHE_VERSION, extra], sort_keys=True, default=str).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def _cached_decode(
    root: Path, tag: str, files: Sequence[Path], extra: Any, build: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Decode once; keep a ``.pt`` copy under ``<root>/.fedsuite_cache`` (best effort)."""
    cache = root / ".fedsuite_cache" / f"{tag}-{_listing_key(files, extra)}.pt"
    if cache.is_file():
        try:
            return torch.load(cache, weights_only=True)
        except Exception:  # noqa: BLE001 - a broken cache is rebuilt
            pass
    data = build()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        torch.save(data, tmp)
        os.replace(tmp, cache)
    except OSError:
        pass  # read-only data root: just do not cache
    return data
