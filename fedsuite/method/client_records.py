"""The names of what a run records per client and of federated evaluation's columns, for the writers
(``fedsuite.method.rounds``, ``fedsuite.engine.client_eval``, ``fedsuite.records.recording``) and the readers
(``fedsuite.records.results``, ``fedsuite.launch.api``, ``fedsuite.records.plots``) alike; no imports, so reading a run's
records loads neither torch nor Flower."""

from __future__ import annotations

#: the fields of a ``clients.jsonl`` row (one client's part in one round): ``sampled`` (in the
#: training cohort), its training reply's ``num_examples``, ``num_steps``, ``train_loss`` and
#: ``train_seconds`` (its own clock), the bytes of every message to and from it, ``failure`` (why its
#: training reply failed), and where it evaluated (``federated_eval``) its test data's size
#: ``eval_examples``, the global model's ``eval_accuracy``/``eval_loss``, the personalised model's
#: ``personal_accuracy``/``personal_loss`` (``finetune_steps``) or ``eval_failure``
CLIENT_FIELDS = ("round", "partition_id", "sampled", "num_examples", "num_steps", "train_loss", "train_seconds",
                 "bytes_sent", "bytes_received", "failure", "eval_examples", "eval_accuracy", "eval_loss",
                 "personal_accuracy", "personal_loss", "eval_failure")

#: the statistics of the clients' accuracies that a federated evaluation adds to ``metrics.jsonl``,
#: each after a prefix, ``client_`` (the global model) or ``personal_`` (the fine-tuned models):
#: sample-weighted, client mean, sample std (ddof = 1), the worst decile's mean, the weighted loss
STATISTICS = ("accuracy_weighted", "accuracy_mean", "accuracy_std", "accuracy_worst10", "loss_weighted")
PREFIXES = ("client", "personal")
#: every ``metrics.jsonl`` column of federated evaluation: the clients that answered and failed, then
#: :data:`STATISTICS` for each of :data:`PREFIXES`
FEDERATED_COLUMNS = ("clients_evaluated", "client_eval_failed",
                     *(f"{prefix}_{stat}" for prefix in PREFIXES for stat in STATISTICS))
