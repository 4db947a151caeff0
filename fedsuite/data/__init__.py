"""fedsuite's data layer: datasets as tensors, partitioners, batch augmentation.

Public API::

    load_dataset(name, root, **options) -> DatasetBundle      # cached per process
    partition_indices(data, scheme, num_clients, seed, *, ...) -> list[np.ndarray]
    to_float(x, bundle) -> Tensor                              # uint8 -> normalised float
    augment_batch(x, kind, generator, *, padding=None) -> Tensor
    label_histogram(labels, parts, num_classes) -> np.ndarray  # [num_clients, num_classes]

``DATASETS`` and ``PARTITIONERS`` map names to functions for the registry.

Modules: ``bundle`` (the DatasetBundle, its checks), ``loading`` (the dataset registry,
``load_dataset`` and each dataset's defaults), one module per family of loaders (``mnist_cifar``,
``image_folders``, ``federated``, ``npz``; ``hf``, ``hf_source``, ``hf_columns`` for Hugging Face
datasets) and what they share (``files``: missing files, downloads, the decode cache), ``augment``,
``partition`` (``partition_indices``, ``label_histogram``), ``partitioners`` (the schemes) and
``partition_cache`` (partitions cached on disk).
"""

from .augment import augment_batch, to_float
from .bundle import AUGMENT_KINDS, DatasetBundle, DatasetError
from .loading import DATASETS, load_dataset
from .mnist_cifar import read_idx
from .partition import label_histogram, partition_indices
from .partitioners import PARTITIONERS

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
