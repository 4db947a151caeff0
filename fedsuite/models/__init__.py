"""The model zoo: one builder per architecture, looked up by name, and the run's model built from it.

* :mod:`fedsuite.models.base`: what every model shares (``features(x)``, the final ``nn.Linear``
  ``head``), the checks of a builder's arguments, :func:`count_parameters`;
* :mod:`fedsuite.models.small`, :mod:`fedsuite.models.resnet`, :mod:`fedsuite.models.vgg`: the
  builders, one module per architecture family (vector models and small CNNs, ResNets, VGGs);
* :mod:`fedsuite.models.zoo`: :data:`MODELS` (name -> builder), :func:`build_model`, and the table of
  the registered models and the inputs each takes;
* :mod:`fedsuite.models.run`: what the engine builds from it: :func:`make_model`,
  :func:`initial_arrays` (w^0), :func:`model_with_state`, :func:`draws_global_rng`.

This package's face re-exports the names the rest of fedsuite imports from ``fedsuite.models``.
"""

from fedsuite.models.base import count_parameters
from fedsuite.models.resnet import resnet18_gn, resnet20
from fedsuite.models.run import draws_global_rng, initial_arrays, make_model, model_with_state
from fedsuite.models.small import cnn, lenet5, logreg, mlp
from fedsuite.models.vgg import vgg9, vgg11, vgg16, vgg16_femnist_authors
from fedsuite.models.zoo import MODELS, build_model

__all__ = [
    "MODELS",
    "build_model",
    "count_parameters",
    "make_model",
    "initial_arrays",
    "model_with_state",
    "draws_global_rng",
    "mlp",
    "logreg",
    "cnn",
    "lenet5",
    "resnet18_gn",
    "resnet20",
    "vgg9",
    "vgg11",
    "vgg16",
    "vgg16_femnist_authors",
]
