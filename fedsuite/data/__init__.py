"""fedsuite's data layer: datasets as tensors, partitioners, batch augmentation.

Public API::

    load_dataset(name, root, **options) -> DatasetBundle      # cached per process
    partition_indices(data, scheme, num_clients, seed, *, ...) -> list[np.ndarray]
    to_float(x, bundle) -> Tensor                              # uint8 -> normalised float
    augment_batch(x, kind, generator, *, padding=None) -> Tensor
    label_histogram(labels, parts, num_classes) -> np.ndarray  # [num_clients, num_classes]

``DATASETS`` and ``PARTITIONERS`` map names to functions for the registry.
"""

from .augment import augment_batch, to_float
from .datasets import AUGMENT_KINDS, DatasetBundle, DatasetError, read_idx
from .loading import DATASETS, load_dataset
from .partition import PARTITIONERS, label_histogram, partition_indices

__all__ = [
    "AUGMENT_KINDS",
    "DATASETS",
    "PARTITIONERS",
    "DatasetBundle",
    "DatasetError",
    "augment_batch",
    "label_histogram",
    "load_dataset",
    "partition_indices",
    "read_idx",
    "to_float",
]
