"""Declared message records (``fedsuite.method.wire.Record``/``Records``): every method's records are
declared once, a reply is checked against its method's declaration, and a reply that lacks a
declared record, or holds a misshapen one, is a failed reply naming the record (as a NaN is), never
a fallback that quietly turns the method into another one. The ClientApp checks each message too.

Strategy level, through the round's protocol (``configure_round`` / ``aggregate_round`` with
hand-built replies by partition id, as tests/test_core.py does): one client of the cohort answers
without the record, the others with everything their method declares.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from clients.ccvr import COUNTS, COVS, MEANS
from clients.feddyn import START_OFFSET
from clients.fedgen import ALPHA, BETA, GEN_BATCH, LABEL_COUNTS
from clients.fedmrur import D2_MAX, D2_MEAN, R_MEAN
from clients.scaffold import DELTA_CV, SERVER_CV
from conftest import make_strategy
from fedsuite.method.registry import methods
from fedsuite.method.replies import Reply, check_reply
from fedsuite.method.wire import (
    ARRAYS, ARRAYS_KIND, CONFIG, METRICS, METRICS_KIND, MODEL_LAYOUT, NUM_EXAMPLES, NUM_STEPS, RECEIVED_CHECKSUM,
    STATISTICS, TRAIN_LOSS, TRAIN_MESSAGE, TRAINABLE_LAYOUT, Record, Records, message_problem, record_checksum,
    to_ndarrays, to_record,
)

pytestmark = pytest.mark.inprocess

#: the strategies below (conftest's ``make_strategy``): 4 clients, 3 a round
CLIENTS = {"num_clients": 4, "cohort": 3}


def complete_reply(strategy, sent: RecordDict, without: str | None = None, replace: dict | None = None) -> Reply:
    """A reply holding the received model and every record the strategy's method declares for a
    reply (its optional ones left out), less the record named ``without``; ``replace`` swaps records."""
    template = strategy.template
    num_classes = template["head.weight"].shape[0]
    content = RecordDict({ARRAYS: to_record(to_ndarrays(sent[ARRAYS]))})
    metrics = {}
    for record in strategy.reply_records:
        if record.optional or record.name == without:
            continue
        if record.kind == METRICS_KIND:
            metrics[record.name] = record_checksum(sent[ARRAYS]) if record.name == RECEIVED_CHECKSUM else 1.0
        elif record.layout == TRAINABLE_LAYOUT:
            content[record.name] = to_record({k: np.zeros_like(template[k]) for k in strategy.record_trainable})
        elif record.layout == MODEL_LAYOUT:
            content[record.name] = to_record(template)
        else:
            content[record.name] = to_record({e: np.full(num_classes, 5, np.int64) for e in record.entries})
    for name, arrays in (replace or {}).items():
        content[name] = to_record(arrays)
    content[METRICS] = MetricRecord(metrics)
    return Reply(content)


def round_with_one_doctored_reply(strategy, **doctor) -> tuple[int, str | None]:
    """Round 1 with every sampled client answering completely but the first, whose reply is doctored
    (``complete_reply``'s ``without`` / ``replace``). Returns (that client, its drop reason)."""
    sent = strategy.configure_round(1, dict(strategy.template))
    victim = sorted(sent)[0]
    replies = {pid: complete_reply(strategy, content, **(doctor if pid == victim else {})) for pid, content in sent.items()}
    strategy.aggregate_round(1, replies)
    assert strategy.round_log.num_replies == len(sent) - 1, strategy.round_log.drop_reasons
    return victim, strategy.round_log.drop_reasons.get(victim)


#: (method, a record its replies must hold): the engine's own keys, then one method of each family
#: that declares records (SCAFFOLD, FedGen, FedMRUR and the FedCM family, FedNova, the pool methods)
REQUIRED = [
    ("fedavg", NUM_EXAMPLES), ("fedavg", TRAIN_LOSS),
    ("scaffold", DELTA_CV),
    ("fedgen", LABEL_COUNTS),
    ("fedmrur", D2_MEAN), ("fedmrur", D2_MAX), ("fedmrur", R_MEAN), ("fedmrur", NUM_STEPS),
    ("fedcm", NUM_STEPS), ("mofedsam", NUM_STEPS), ("fednova", NUM_STEPS),
    ("fedmr", RECEIVED_CHECKSUM), ("fedmut", RECEIVED_CHECKSUM), ("indep", RECEIVED_CHECKSUM),
    ("indep-aggr", RECEIVED_CHECKSUM),
]


def test_every_required_reply_record_of_every_method_is_covered():
    """Each method's required reply records (its registration's ``records``) are in :data:`REQUIRED`,
    so a method that declares a new one gets the missing-record test below."""
    declared = {(name, r.name) for name, spec in methods().items() for r in spec.records.reply if not r.optional}
    assert declared <= set(REQUIRED), sorted(declared - set(REQUIRED))


@pytest.mark.parametrize("method, record", REQUIRED)
def test_a_reply_missing_a_declared_record_is_a_failed_reply_naming_it(method, record):
    strategy = make_strategy(method, **CLIENTS, **({"fedgen.ensemble_epochs": 1} if method == "fedgen" else {}))
    assert record in {r.name for r in strategy.reply_records}
    victim, reason = round_with_one_doctored_reply(strategy, without=record)
    assert reason is not None and repr(record) in reason, reason
    assert strategy.round_log.failed == 1


def test_fedmrur_declares_its_diagnostics_only_with_the_regulariser_on():
    """``hyperbolic=false`` (FedMRUR-N): the client reports no distances, and a reply without them is fine."""
    strategy = make_strategy("fedmrur", **CLIENTS, **{"fedmrur.hyperbolic": False})
    assert not {D2_MEAN, D2_MAX, R_MEAN} & {r.name for r in strategy.reply_records}
    _, reason = round_with_one_doctored_reply(strategy, without=NUM_STEPS)
    assert repr(NUM_STEPS) in reason


@pytest.mark.parametrize("method, record", [("scaffold", DELTA_CV), ("feddyn", START_OFFSET)])
def test_a_misshapen_trainable_record_is_a_failed_reply_naming_it(method, record):
    """SCAFFOLD's Δc_i and FedDyn's start offset r_i (optional: checked when present) must cover the
    trainable parameters with their shapes: one parameter short, or one of the wrong shape, fails the reply."""
    strategy = make_strategy(method, **CLIENTS)
    keys = strategy.record_trainable
    short = {k: np.zeros_like(strategy.template[k]) for k in keys[1:]}
    _, reason = round_with_one_doctored_reply(strategy, replace={record: short})
    assert reason == f"record {record!r}: array names differ from the trainable parameters'"
    wrong = {k: np.zeros_like(strategy.template[k]) for k in keys}
    wrong[keys[0]] = np.zeros(3, np.float32)
    strategy = make_strategy(method, **CLIENTS)
    _, reason = round_with_one_doctored_reply(strategy, replace={record: wrong})
    assert reason.startswith(f"record {record!r}: array {keys[0]!r} has shape (3,)"), reason


def test_feddyn_reads_a_present_start_offset():
    """A complete FedDyn reply with r_i = 0 gives the same model as one without the record (no offset)."""
    a, b = make_strategy("feddyn", **CLIENTS), make_strategy("feddyn", **CLIENTS)
    sent = a.configure_round(1, dict(a.template))
    b.configure_round(1, dict(b.template))
    zero = {k: np.zeros_like(a.template[k]) for k in a.record_trainable}
    with_offset = a.aggregate_round(1, {p: complete_reply(a, c, replace={START_OFFSET: zero}) for p, c in sent.items()})[0]
    without = b.aggregate_round(1, {p: complete_reply(b, c) for p, c in sent.items()})[0]
    assert all(np.array_equal(with_offset[k], without[k]) for k in without)


def test_a_ccvr_statistics_reply_missing_an_entry_fails_naming_it():
    """CCVR's statistics record must hold counts, means and covs (its declaration), else the reply fails."""
    strategy = make_strategy("ccvr", **CLIENTS)
    declared = strategy.records.statistics
    assert [r.name for r in declared] == [STATISTICS] and declared[0].entries == (COUNTS, MEANS, COVS)
    full = {COUNTS: np.ones(3, np.int64), MEANS: np.zeros((3, 2), np.float32), COVS: np.zeros((3, 2, 2), np.float32)}

    def stats_reply(stats):
        return Reply(RecordDict({STATISTICS: to_record(stats), METRICS: MetricRecord({NUM_EXAMPLES: 3})}))

    problem, records = strategy.receive(stats_reply(full), STATISTICS, pid=0, records=declared)
    assert problem is None and set(records[STATISTICS]) == {COUNTS, MEANS, COVS}
    for entry in (COUNTS, MEANS, COVS):
        problem, _ = strategy.receive(stats_reply({k: v for k, v in full.items() if k != entry}), STATISTICS, pid=0,
                                      records=declared)
        assert problem == f"record {STATISTICS!r}: lacks {entry!r}"


@pytest.mark.parametrize("method, key", [("fedgen", ALPHA), ("fedgen", BETA), ("fedgen", GEN_BATCH),
                                         ("scaffold", SERVER_CV), ("fedavg", "lr"), ("fedavg", "server-round")])
def test_a_message_missing_a_declared_record_is_refused_by_the_client(method, key):
    """What the server sends carries every declared message record; without one, the ClientApp's
    check (``message_problem``, run before training) names it, and the client's reply fails with it."""
    strategy = make_strategy(method, **CLIENTS)
    declared = TRAIN_MESSAGE + strategy.records.message
    for content in strategy.configure_round(1, dict(strategy.template)).values():
        assert message_problem(content, declared, strategy.cfg) is None
        doctored = RecordDict({name: rec for name, rec in content.items() if name != key})
        if key in content[CONFIG]:
            doctored[CONFIG] = ConfigRecord({k: v for k, v in content[CONFIG].items() if k != key})
            assert message_problem(doctored, declared, strategy.cfg) == f"message config lacks {key!r}"
        else:
            assert message_problem(doctored, declared, strategy.cfg) == f"message lacks record {key!r}"


def test_a_declaration_is_checked_when_made():
    with pytest.raises(ValueError, match="kind"):
        Record("x", "array")
    with pytest.raises(ValueError, match="only an arrays record"):
        Record("x", METRICS_KIND, layout=TRAINABLE_LAYOUT)
    with pytest.raises(ValueError, match="declared twice"):
        Records(reply=(Record("x", METRICS_KIND),)) + Records(reply=(Record("x", ARRAYS_KIND),))


def test_check_reply_without_declared_records_is_unchanged():
    """A metric declared optional may be absent; present, it must be a number."""
    content = RecordDict({METRICS: MetricRecord({NUM_EXAMPLES: 3})})
    optional = (Record(NUM_STEPS, METRICS_KIND, optional=True),)
    assert check_reply(Reply(content), None, METRICS, records=optional) == (None, {})
    content[METRICS][NUM_STEPS] = [1.0]
    assert check_reply(Reply(content), None, METRICS, records=optional)[0] == f"metrics[{NUM_STEPS!r}] is [1.0], not a number"


# --- reading an Array ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.array(3.5), np.zeros((0, 3), np.int64),
    np.array([True, False]), np.arange(5, dtype=np.float16), np.arange(6, dtype=">f8").reshape(2, 3),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)), np.arange(24).reshape(2, 3, 4)[:, ::2],
    np.array(["ab", "c"]), np.arange(4, dtype=np.complex64), np.zeros((2, 3), [("a", "<i4"), ("b", "<f8")]),
], ids=["f32", "0-d", "empty", "bool", "f16", "big-endian", "fortran", "strided", "unicode", "complex", "structured"])
def test_an_arrays_numpy_value_is_flowers_without_parsing_its_header(value, monkeypatch):
    """``fedsuite.method.wire.ndarray`` returns what Flower's ``Array.numpy()`` (``np.load``) returns: the
    same values, dtype, shape, memory order and writability; for every header ``np.save`` writes but
    a structured dtype's, without compiling Python (``ast.literal_eval``, which threads must not run
    at once on CPython 3.11: gh-106905)."""
    import builtins

    from flwr.app import Array

    from fedsuite.method.wire import ndarray

    array = Array(value)
    want = array.numpy()
    compiled: list[str] = []
    compile_ = builtins.compile
    monkeypatch.setattr(builtins, "compile", lambda *a, **k: compiled.append(a[1]) or compile_(*a, **k))
    got = ndarray(array)
    monkeypatch.undo()
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert (got.flags.writeable, got.flags.c_contiguous, got.flags.f_contiguous) == \
        (want.flags.writeable, want.flags.c_contiguous, want.flags.f_contiguous)
    assert compiled == ([] if value.dtype.names is None else ["<unknown>"])


def test_an_array_of_a_version_2_header_or_of_cut_bytes():
    """A .npy of format 2.0 (a 4-byte header length) is read as well; bytes cut short raise numpy's
    own error, as ``Array.numpy()`` does."""
    import io

    from flwr.app import Array

    from fedsuite.method.wire import ndarray

    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.arange(3.0), version=(2, 0))
    whole = buffer.getvalue()
    assert np.array_equal(ndarray(Array(dtype="float64", shape=(3,), stype="numpy.ndarray", data=whole)),
                          np.arange(3.0))
    with pytest.raises(ValueError, match="expected 24 bytes got 21"):
        ndarray(Array(dtype="float64", shape=(3,), stype="numpy.ndarray", data=whole[:-3]))
