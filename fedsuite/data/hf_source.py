"""Where dataset ``hf`` reads a Hugging Face dataset from: a local copy, the datasets cache, or the hub.

:func:`_resolve` tells a local file or folder (absolute, ``~``, or under the data root) from a hub
id. A local copy is read by :func:`_load_local` (``save_to_disk`` output, data files, image
folders), with the hub switched off. A hub id is read by :func:`_load_hub` from the datasets cache
first, with the hub switched off (:func:`hub_offline`); only a dataset that is not cached is
downloaded, and only when the hub answers within :data:`HUB_PROBE_TIMEOUT_S` seconds
(:func:`hub_unreachable`) and neither ``HF_HUB_OFFLINE`` nor ``HF_DATASETS_OFFLINE`` is set
(:func:`offline_requested`); otherwise :class:`DatasetError` names what is missing and how to get it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .bundle import DatasetError

__all__ = ["HUB_PROBE_TIMEOUT_S", "hub_offline", "hub_unreachable", "offline_requested"]

#: seconds to wait for the hub before a dataset that is not cached is reported missing
HUB_PROBE_TIMEOUT_S = 3.0

_TRUE = {"1", "ON", "YES", "TRUE"}


def _one_line(exc: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(exc).split())
    return msg if len(msg) <= limit else msg[:limit] + "..."


# --------------------------------------------------------------------------------------------
# offline mode and the hub


def offline_requested() -> bool:
    """Whether the user switched the hub off (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE``)."""
    import datasets.config

    env = any(os.environ.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return env or bool(datasets.config.HF_HUB_OFFLINE)


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Switch the hub off for what runs inside: ``datasets`` and ``huggingface_hub`` read their
    offline flags when they are imported, so the flags they consult at call time are set here
    (and the environment variables, for any process they start), then put back."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    os.environ.update({k: "1" for k in saved_env})
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None when the hub's endpoint answers an HTTP request within ``timeout`` seconds (any status:
    the server is there), else why not. The request runs in a daemon thread that is waited for at
    most ``timeout`` + 0.5 seconds, so neither a name lookup nor a connection that never answers (a
    firewall dropping packets) holds the caller longer."""
    import datasets.config

    endpoint = str(datasets.config.HF_ENDPOINT).rstrip("/")
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)  # an HTTP answer: the hub is reachable
        except Exception as exc:  # noqa: BLE001 - every failure means "not reachable"
            if isinstance(getattr(exc, "reason", exc), TimeoutError):  # urlopen's timeout: connect or read
                outcome.append(f"{endpoint} did not answer within {timeout:g} s")
            else:
                outcome.append(f"{endpoint} did not answer: {_one_line(exc, 120)}")

    thread = threading.Thread(target=probe, name="fedsuite-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)  # urlopen's timeout bounds connect and read; this also bounds a name lookup
    if not outcome:
        return f"{endpoint} did not answer within {timeout:g} s"
    return outcome[0]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars or cache notices from ``datasets`` on the run's output."""
    import datasets

    bars_off, level = datasets.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if not bars_off:
            datasets.enable_progress_bars()


def _missing_line(path: str, config_name: str | None, cache: str, why: str) -> str:
    args = f'"{path}"' + (f', "{config_name}"' if config_name else "")
    return (
        f"hf: the Hugging Face dataset '{path}' is not in the datasets cache {cache} and cannot be downloaded "
        f"({why}); on a machine with internet run `python -c 'import datasets; datasets.load_dataset({args})'`, "
        f"then copy its ~/.cache/huggingface/datasets to {cache} here, or point path at a local copy "
        "(a save_to_disk folder or parquet files)."
    )


def _load_hub(path: str, config_name: str | None, cache_dir: str | None) -> Any:
    import datasets

    cache = str(Path(cache_dir or datasets.config.HF_DATASETS_CACHE).expanduser())
    kwargs: dict[str, Any] = {"cache_dir": cache_dir} if cache_dir else {}
    try:  # the cache first, hub off: no network wait for a dataset that is there
        with hub_offline():
            return datasets.load_dataset(path, config_name, **kwargs)
    except ValueError as exc:
        if "multiple" in str(exc) and "configuration" in str(exc):  # several configs cached: which one?
            raise DatasetError(f"hf: {_one_line(exc)} (pass it as dataset_options={{config_name=...}}).") from None
    except (ConnectionError, FileNotFoundError):
        pass  # not cached
    if offline_requested():
        raise DatasetError(_missing_line(path, config_name, cache, "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set"))
    why = hub_unreachable()
    if why is not None:
        raise DatasetError(_missing_line(path, config_name, cache, why))
    try:
        return datasets.load_dataset(path, config_name, **kwargs)
    except ConnectionError as exc:
        raise DatasetError(_missing_line(path, config_name, cache, _one_line(exc, 150))) from None
    except Exception as exc:  # noqa: BLE001 - not on the hub, gated, no data files: the library's words
        raise DatasetError(f"hf: '{path}' could not be loaded from the Hugging Face Hub: {_one_line(exc)}") from None


def _load_local(folder: Path, config_name: str | None, cache_dir: str | None) -> Any:
    import datasets

    try:
        with hub_offline():
            if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
                loaded = datasets.load_from_disk(str(folder))
            elif folder.is_file():
                kind = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv", ".json": "json",
                        ".jsonl": "json"}.get(folder.suffix.lower())
                if kind is None:
                    raise DatasetError(f"hf: {folder} is a file the datasets library cannot read as a dataset; "
                                       "point path at a folder (or a .parquet, .arrow, .csv or .json file).")
                loaded = datasets.load_dataset(kind, data_files={"train": str(folder)}, cache_dir=cache_dir)
            else:
                loaded = datasets.load_dataset(str(folder), config_name, cache_dir=cache_dir)
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's reason, on one line
        raise DatasetError(
            f"hf: {folder} holds no dataset the datasets library can read (a save_to_disk folder, parquet/arrow/"
            f"csv/json files, or images in <split>/<class>/ folders): {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})


def _resolve(path: str, root: Path) -> Path | None:
    """The local file or folder ``path`` names (absolute, ``~``, or relative to the data root), or
    None when it names none (then it is a hub id)."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p if p.exists() else None
    return (root / p) if (root / p).exists() else None
