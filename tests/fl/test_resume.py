"""The round loop owns the privacy event, the ledger and resume (issues 10, 14, 16, 24).

Regression tests: the loop derives and charges the event of what runs; a resumed run carries
its recorded cost, is charged for more rounds or refused, matches its config fingerprint; one
atomic checkpoint (kill -9 anywhere resumes bit-identically, tampering is refused); a damaged
latest commit falls back to the newest intact one unless its ledger would under-report the
spend; exactly one metrics row per round after any crashes, gaps reported; strict-JSON metrics;
a bug in the loss surfaces before the ledger is charged; stage-tagged keys. Issue 54: a
resumed run never runs a round it was not charged for; two runs with one stage name in one
ledger, and a resume under other ledger populations, are refused; an empty Poisson round still
releases the accounted noise.
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import dp_accounting as dpa
import jax
import numpy as np
import optax
import pytest

from fedpriv.dp.accounting import compute_epsilon
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger, event_to_json
from fedpriv.fl.algorithms import dp_fedavg, dp_ftrl, privacy_event, server_optimizer
from fedpriv.fl.checkpoint import CHECKPOINTS, Checkpointer, CheckpointError, ResumeMismatch
from fedpriv.fl.loop import METRICS, PrivacyAccountingError, dumps_row, fork_run, load_run, read_metrics, train
from fedpriv.fl.samplers import PoissonSampler, ShuffledPassSampler
from fedpriv.public.pretrain import train_central
from tests.fl.helpers import init_params, loss_fn, make_dataset
from tests.oracles import executed_noise_cohort_event, pld_epsilon, rdp_epsilon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ftrl(z=1.0, clip=0.5, n=30, cohort=5, seed=0):
    s = ShuffledPassSampler(n, cohort, seed=seed)
    alg = dp_ftrl(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=clip,
                  noise_multiplier=z, expected_cohort_size=cohort, rounds_per_epoch=s.rounds_per_epoch)
    return s, alg


@pytest.fixture(scope="module")
def data():
    d = make_dataset(num_clients=30, seed=2)
    return d, list(d)


def _kw(wd, **over):
    kw = dict(batch_size=4, seed=1, max_steps=4, progress=False, workdir=str(wd), log=None)
    kw.update(over)
    return kw


def _rows(wd):
    return [json.loads(line) for line in open(os.path.join(wd, METRICS))]


def _leaves_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ------------------------------------------------------------------ the loop derives the event
def test_train_charges_the_event_of_the_rounds_it_runs(data, tmp_path):
    d, ids = data
    s, alg = _ftrl()
    led = PrivacyLedger(1e6, 1e-6)
    res = train(alg, init_params(), d, ids, s, rounds=50, ledger=led, **_kw(tmp_path / "a"))
    entry = led.entry("fl-training")
    assert event_to_json(entry.event) == event_to_json(privacy_event(alg.dp, s, 50))
    assert entry.details["rounds"] == 50 and entry.details["noise_multiplier"] == 1.0
    assert entry.details["sampler"]["type"] == "ShuffledPassSampler"
    assert res.ledger is led and res.charged_rounds == 50 and int(res.state.round) == 50
    # a budget that covers 2 rounds refuses a 50-round run before anything runs
    two = compute_epsilon(privacy_event(alg.dp, s, 2), 1e-6)[0]
    with pytest.raises(PrivacyBudgetExceeded):
        train(alg, init_params(), d, ids, s, rounds=50, ledger=PrivacyLedger(two * 1.01, 1e-6),
              **_kw(tmp_path / "b"))
    assert not os.path.exists(tmp_path / "b" / METRICS) and load_run(str(tmp_path / "b")) is None
    # the caller cannot hand the loop an event any more
    with pytest.raises(TypeError):
        train(alg, init_params(), d, ids, s, rounds=2, ledger=PrivacyLedger(1e6, 1e-6),
              privacy_event=privacy_event(alg.dp, s, 2), **_kw(tmp_path / "c"))


def test_private_run_without_ledger_refused_unless_explicit(data, tmp_path):
    d, ids = data
    s, alg = _ftrl()
    with pytest.raises(PrivacyAccountingError, match="needs a PrivacyLedger"):
        train(alg, init_params(), d, ids, s, rounds=2, **_kw(tmp_path / "a"))
    assert not os.path.exists(tmp_path / "a" / METRICS)
    res = train(alg, init_params(), d, ids, s, rounds=2, nonprivate_ok=True, **_kw(tmp_path / "b"))
    assert res.ledger is None and res.event is None
    # a non-private algorithm cannot be charged to a ledger (its epsilon is infinite)
    fedavg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=float("inf"),
                       noise_multiplier=0.0, expected_cohort_size=5)
    with pytest.raises(PrivacyAccountingError, match="not private"):
        train(fedavg, init_params(), d, ids, s, rounds=2, ledger=PrivacyLedger(1.0, 1e-6),
              **_kw(tmp_path / "c"))


def test_simulated_noise_cohort_records_executed_epsilon(data, tmp_path):
    d, ids = data
    p = PoissonSampler(30, 5 / 30, seed=0)
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=0.5,
                    noise_multiplier=1.0, expected_cohort_size=5, noise_cohort_size=50)
    led = PrivacyLedger(1e6, 1e-6)
    res = train(alg, init_params(), d, ids, p, rounds=4, ledger=led, **_kw(tmp_path))
    row = led.report()["entries"][0]
    assert row["details"]["simulated_population"] and row["details"]["noise_cohort_size"] == 50
    executed = compute_epsilon(privacy_event(alg.dp, p, 4, simulated=False), 1e-6)[0]
    assert row["epsilon_executed_alone"] == pytest.approx(executed, rel=1e-6)
    assert row["epsilon_executed_alone"] > row["epsilon_alone"]
    assert event_to_json(res.executed_event) == event_to_json(privacy_event(alg.dp, p, 4, simulated=False))
    # the run executed: 5 clients per round under the noise of 50, multiplier 1.0 * 5 / 50 (the
    # charged simulation: multiplier 1.0), by dp_accounting's RDP (PLD needs z >= 0.3)
    assert row["epsilon_executed_alone"] == pytest.approx(
        rdp_epsilon([executed_noise_cohort_event(1.0, 5 / 30, 5, 50, 4)], 1e-6), rel=1e-9)
    assert row["epsilon_alone"] == pytest.approx(
        min(rdp_epsilon([executed_noise_cohort_event(1.0, 5 / 30, 50, 50, 4)], 1e-6),
            pld_epsilon([executed_noise_cohort_event(1.0, 5 / 30, 50, 50, 4)], 1e-6)), rel=1e-9)


# ------------------------------------------------------------------ resume carries the cost
def test_resume_with_more_rounds_charges_the_new_total_or_refuses(data, tmp_path):
    d, ids = data
    s, alg = _ftrl(z=1.0)
    eps = lambda r: compute_epsilon(privacy_event(alg.dp, s, r), 1e-6)[0]
    wd = tmp_path / "run"
    led = PrivacyLedger(eps(4) * (1 + 1e-6), 1e-6)
    train(alg, init_params(), d, ids, s, rounds=4, ledger=led, **_kw(wd))
    assert led.spent() == pytest.approx(eps(4))
    # the checkpoint's ledger (budget eps(4)) cannot pay for 40 rounds: refused, nothing runs
    with pytest.raises(PrivacyBudgetExceeded):
        train(alg, init_params(), d, ids, s, rounds=40, **_kw(wd))
    assert load_run(str(wd)).round == 4 and len(_rows(wd)) == 4
    # a ledger with room: the run's entry is replaced by the event of all 40 rounds
    logs = []
    big = PrivacyLedger(100.0, 1e-6)
    res = train(alg, init_params(), d, ids, s, rounds=40, ledger=big, **_kw(wd, log=logs.append))
    assert res.resumed_from == 4 and int(res.state.round) == 40 and res.charged_rounds == 40
    assert [e.name for e in big.entries] == ["fl-training"]
    assert big.spent() == pytest.approx(eps(40)) and eps(40) > 2 * eps(4)
    assert big.entry("fl-training").details["rounds"] == 40
    assert "resumed" in logs[0] and "round 4 of 40" in logs[0] and f"{eps(40):.4g}" in logs[0]
    assert load_run(str(wd)).ledger.spent() == pytest.approx(eps(40))
    assert [r["round"] for r in _rows(wd)] == list(range(1, 41))
    # fewer rounds than the checkpoint has run: refused
    with pytest.raises(CheckpointError, match="round 40 > rounds=10"):
        train(alg, init_params(), d, ids, s, rounds=10, **_kw(wd))


def test_resume_merges_the_recorded_cost_into_the_callers_ledger(data, tmp_path):
    """A pipeline rerun in the same workdir: the caller's fresh ledger (earlier stage re-spent)
    ends holding the recorded FL cost too, once (FreD pipeline: 59.97 then 0.87 before)."""
    d, ids = data
    s, alg = _ftrl(z=1.0)
    prior = privacy_event(alg.dp, s, 3)  # stands for an earlier release on the same users
    first = PrivacyLedger(100.0, 1e-6)
    first.spend("earlier release", prior)
    train(alg, init_params(), d, ids, s, rounds=6, ledger=first, stop_after=3, **_kw(tmp_path))
    again = PrivacyLedger(100.0, 1e-6)
    again.spend("earlier release", prior)
    train(alg, init_params(), d, ids, s, rounds=6, ledger=again, **_kw(tmp_path))
    assert [e.name for e in again.entries] == ["earlier release", "fl-training"]
    assert again.spent() == pytest.approx(first.spent())
    # a caller ledger whose budget cannot hold the recorded cost is refused
    tight = PrivacyLedger(first.spent() * 0.5, 1e-6)
    with pytest.raises(PrivacyBudgetExceeded):
        train(alg, init_params(), d, ids, s, rounds=6, ledger=tight, **_kw(tmp_path))
    assert tight.entries == []


def test_checkpoint_without_ledger_refused(data, tmp_path):
    d, ids = data
    s, alg = _ftrl()
    wd = tmp_path / "run"
    train(alg, init_params(), d, ids, s, rounds=6, stop_after=2, nonprivate_ok=True, **_kw(wd))
    assert load_run(str(wd)).ledger is None
    with pytest.raises(PrivacyAccountingError, match="no ledger"):  # budget 0.01, spends 0 before
        train(alg, init_params(), d, ids, s, rounds=6, ledger=PrivacyLedger(0.01, 1e-6), **_kw(wd))
    with pytest.raises(PrivacyAccountingError, match="no ledger"):
        train(alg, init_params(), d, ids, s, rounds=6, **_kw(wd))
    assert load_run(str(wd)).round == 2
    res = train(alg, init_params(), d, ids, s, rounds=6, nonprivate_ok=True, **_kw(wd))
    assert int(res.state.round) == 6
    # an accounted checkpoint whose ledger is null (written by other code) is refused too
    wd2 = tmp_path / "run2"
    train(alg, init_params(), d, ids, s, rounds=6, stop_after=2, ledger=PrivacyLedger(1e6, 1e-6),
          **_kw(wd2))
    template = alg.init(init_params(), jax.random.key(0))
    run = load_run(str(wd2), template)
    Checkpointer(os.path.join(wd2, CHECKPOINTS)).save(run.state, {**run.meta, "ledger": None})
    with pytest.raises(PrivacyAccountingError, match="no ledger"):
        train(alg, init_params(), d, ids, s, rounds=6, nonprivate_ok=True, **_kw(wd2))


# ------------------------------------------------------------------ config fingerprint
def test_resume_with_another_config_refuses_naming_the_field(data, tmp_path):
    d, ids = data
    s, alg = _ftrl(z=1.0)
    wd = tmp_path / "run"
    led = lambda: PrivacyLedger(1e6, 1e-6)
    train(alg, init_params(), d, ids, s, rounds=6, stop_after=2, ledger=led(),
          fingerprint={"server_lr": 1.0}, **_kw(wd))
    _, alg_z = _ftrl(z=0.5)
    with pytest.raises(ResumeMismatch, match=r"dp\.noise_multiplier: 1\.0 -> 0\.5.*change privacy"):
        train(alg_z, init_params(), d, ids, s, rounds=6, ledger=led(), fingerprint={"server_lr": 1.0},
              **_kw(wd))
    with pytest.raises(ResumeMismatch, match=r"seed: 1 -> 2"):
        train(alg, init_params(), d, ids, s, rounds=6, ledger=led(), fingerprint={"server_lr": 1.0},
              **_kw(wd, seed=2))
    s2, _ = _ftrl(seed=7)
    with pytest.raises(ResumeMismatch, match=r"sampler\.seed"):
        train(alg, init_params(), d, ids, s2, rounds=6, ledger=led(), fingerprint={"server_lr": 1.0},
              **_kw(wd, resume_anyway=["sampler"]))  # privacy fields cannot be overridden
    with pytest.raises(ResumeMismatch, match=r"stage: 'fl-training' -> 'other'"):
        train(alg, init_params(), d, ids, s, rounds=6, ledger=led(), stage="other",
              fingerprint={"server_lr": 1.0}, **_kw(wd))
    with pytest.raises(ResumeMismatch, match=r"extra\.server_lr: 1\.0 -> 0\.5.*resume_anyway"):
        train(alg, init_params(), d, ids, s, rounds=6, ledger=led(), fingerprint={"server_lr": 0.5},
              **_kw(wd))
    with pytest.raises(ResumeMismatch, match=r"batch_size: 4 -> 8"):
        train(alg, init_params(), d, ids, s, rounds=6, ledger=led(), fingerprint={"server_lr": 1.0},
              **_kw(wd, batch_size=8))
    assert load_run(str(wd)).round == 2
    # training-only fields may differ when named
    res = train(alg, init_params(), d, ids, s, rounds=6, ledger=led(), fingerprint={"server_lr": 0.5},
                **_kw(wd, batch_size=8, resume_anyway=["server_lr", "batch_size"]))
    assert res.resumed_from == 2 and int(res.state.round) == 6


def test_central_training_checkpoint_fingerprint(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    data = {"x": x, "y": x.sum(1).astype(np.float32)}
    kw = dict(batch_size=8, optimizer=optax.adam(0.1), workdir=str(tmp_path), progress=False, log=None)
    train_central(loss_fn, init_params(), data, steps=5, seed=0, **kw)
    with pytest.raises(ResumeMismatch, match="seed: 0 -> 1"):
        train_central(loss_fn, init_params(), data, steps=10, seed=1, **kw)
    with pytest.raises(ResumeMismatch, match="data"):
        train_central(loss_fn, init_params(), {**data, "y": data["y"] + 1}, steps=10, seed=0, **kw)
    _, hist = train_central(loss_fn, init_params(), data, steps=10, seed=0, **kw)
    assert [h["step"] for h in hist] == list(range(1, 11))


# ------------------------------------------------------------------ one atomic checkpoint
def _edit_meta(wd, commit, **changes):
    path = os.path.join(wd, CHECKPOINTS, str(commit), "meta", "metadata")
    meta = json.load(open(path))
    json.dump({**meta, **changes}, open(path, "w"))
    return meta


def test_tampered_or_legacy_checkpoint_refused(data, tmp_path):
    """With no intact commit left (every one edited, or states mixed between commits) the
    checkpoint is refused: fail closed, never a silent fresh start."""
    d, ids = data
    s, alg = _ftrl()
    wd = tmp_path / "run"
    kw = _kw(wd, checkpoint_every=2, nonprivate_ok=True)
    train(alg, init_params(), d, ids, s, rounds=8, stop_after=4, **kw)
    ck = os.path.join(wd, CHECKPOINTS)
    assert sorted(n for n in os.listdir(ck) if n.isdigit()) == ["0", "1"]
    assert _edit_meta(wd, 1, round=2)["round"] == 4  # "crash between the two files", by an edit
    _edit_meta(wd, 0, round=4)
    with pytest.raises(CheckpointError, match="no intact checkpoint.*integrity"):
        train(alg, init_params(), d, ids, s, rounds=8, **kw)
    assert sorted(n for n in os.listdir(ck) if n.isdigit()) == ["0", "1"]  # nothing moved
    # state of one commit with the metadata of another (the older one loses its state)
    _edit_meta(wd, 1, round=4)
    _edit_meta(wd, 0, round=2)
    os.rename(os.path.join(ck, "1", "state"), str(tmp_path / "state"))
    os.rename(os.path.join(ck, "0", "state"), os.path.join(ck, "1", "state"))
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        train(alg, init_params(), d, ids, s, rounds=8, **kw)
    # the old two-file format is not resumed
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "checkpoint.msgpack").write_bytes(b"\x80")
    (legacy / "checkpoint.json").write_text('{"round": 2, "ledger": null}')
    with pytest.raises(CheckpointError, match="old two-file format"):
        train(alg, init_params(), d, ids, s, rounds=8, **_kw(legacy, nonprivate_ok=True))


def test_damaged_latest_commit_falls_back_to_the_newest_intact_one(data, tmp_path):
    """The run continues from the intact commit orbax kept, says so in one line, and ends
    bit-identical to an uninterrupted run with the same charge; the damaged commit is moved
    aside (not deleted) so keep-N cannot later drop the intact one in its favour."""
    d, ids = data
    s, alg = _ftrl()
    wd = tmp_path / "run"
    led = lambda: PrivacyLedger(1e6, 1e-6)
    train(alg, init_params(), d, ids, s, rounds=8, stop_after=4, ledger=led(),
          **_kw(wd, checkpoint_every=2))
    _edit_meta(wd, 1, round=2)
    logs = []
    res = train(alg, init_params(), d, ids, s, rounds=8, ledger=led(),
                **_kw(wd, checkpoint_every=2, log=logs.append))
    assert res.resumed_from == 2 and [c for c, _ in res.fell_back] == [1]
    assert "commit 1: fails its integrity check" in logs[0], logs
    assert "fell back to the newest intact commit 0 (round 2)" in logs[0] and "\n" not in logs[0]
    ref = train(alg, init_params(), d, ids, s, rounds=8, ledger=led(),
                **_kw(tmp_path / "ref", checkpoint_every=2))
    _leaves_equal(res.state.params, ref.state.params)
    assert res.ledger.spent() == ref.ledger.spent() and res.charged_rounds == 8
    assert _rows(wd) == _rows(tmp_path / "ref")
    assert [n.split("-")[0] for n in os.listdir(wd / (CHECKPOINTS + ".damaged"))] == ["1"]
    assert load_run(str(wd)).round == 8


def test_fallback_refused_when_the_intact_commit_would_under_report_the_spend(data, tmp_path):
    """Run for 4 rounds, extend to 8 (charged 8, commit at round 6), damage that commit: the
    intact commit at round 4 charged only 4 rounds. Falling back and finishing at 4 rounds
    would report the 4-round epsilon for a workdir whose rounds 5-6 ran under the 8-round
    charge: refused, whether the evidence is the damaged commit's own metadata or (metadata
    unreadable) the metrics log; resuming for all 8 rounds charges them again and is allowed."""
    d, ids = data
    s, alg = _ftrl()
    wd = tmp_path / "run"
    led = lambda: PrivacyLedger(1e6, 1e-6)
    train(alg, init_params(), d, ids, s, rounds=4, ledger=led(), **_kw(wd, checkpoint_every=2))
    train(alg, init_params(), d, ids, s, rounds=8, stop_after=2, ledger=led(),
          **_kw(wd, checkpoint_every=2))
    assert _edit_meta(wd, 2, round=5)["charged_rounds"] == 8
    with pytest.raises(PrivacyAccountingError, match="damaged commit 2 shows 8 rounds"):
        train(alg, init_params(), d, ids, s, rounds=4, ledger=led(), **_kw(wd))
    shutil.rmtree(wd / CHECKPOINTS / "2" / "meta")
    with pytest.raises(PrivacyAccountingError, match="metrics.jsonl shows 6 rounds"):
        train(alg, init_params(), d, ids, s, rounds=4, ledger=led(), **_kw(wd))
    assert [r["round"] for r in _rows(wd)] == list(range(1, 7))  # refusals changed nothing
    assert sorted(n for n in os.listdir(wd / CHECKPOINTS) if n.isdigit()) == ["1", "2"]
    big = led()
    with pytest.warns(RuntimeWarning, match="commit 2: .* damaged; fell back to the newest intact "
                                            r"commit 1 \(round 4\)"):
        res = train(alg, init_params(), d, ids, s, rounds=8, ledger=big, **_kw(wd))  # log=None
    assert res.resumed_from == 4 and res.charged_rounds == 8 and int(res.state.round) == 8
    assert big.spent() == pytest.approx(compute_epsilon(privacy_event(alg.dp, s, 8), 1e-6)[0])


def test_missing_metrics_rows_are_reported_as_gaps(data, tmp_path):
    """A deleted or cut metrics.jsonl cannot be rebuilt from a checkpoint (it holds the state,
    not the curve): resume says in one line which rounds are missing, instead of a silent gap."""
    d, ids = data
    s, alg = _ftrl()
    kw = _kw(tmp_path, checkpoint_every=2, nonprivate_ok=True)
    train(alg, init_params(), d, ids, s, rounds=8, stop_after=4, **kw)
    os.remove(tmp_path / METRICS)
    logs = []
    res = train(alg, init_params(), d, ids, s, rounds=8, stop_after=2, **{**kw, "log": logs.append})
    assert res.metrics_gaps == [(1, 4)]
    assert any("no rows for rounds 1..4" in m and "gaps" in m for m in logs), logs
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == [5, 6]
    with open(tmp_path / METRICS, "w") as f:  # cut: rounds 2 and 4 lost
        f.writelines(json.dumps(r) + "\n" for r in [{"round": 1}, {"round": 3}, *rows])
    with pytest.warns(RuntimeWarning, match=r"no rows for rounds 2, 4 \(deleted"):
        res = train(alg, init_params(), d, ids, s, rounds=8, **kw)  # log=None: a warning
    assert res.metrics_gaps == [(2, 2), (4, 4)]
    assert [r["round"] for r in _rows(tmp_path)] == [1, 3, 5, 6, 7, 8]


def test_metrics_jsonl_is_strict_json_and_old_files_still_read(data, tmp_path):
    """No bare NaN/Infinity (invalid JSON for strict readers): non-finite values are null with
    their value under "nonfinite"; ``read_metrics`` restores them, and reads old files too."""
    d, ids = data
    s, alg = _ftrl()
    train(alg, init_params(), d, ids, s, rounds=2, nonprivate_ok=True, **_kw(tmp_path))

    def strict(line):
        return json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in {line}"))
    raw = [strict(line) for line in open(tmp_path / METRICS)]
    assert raw[0]["unclipped_estimate"] is None  # NaN without adaptive clipping
    assert raw[0]["nonfinite"] == {"unclipped_estimate": "nan"}
    back = read_metrics(str(tmp_path))
    assert math.isnan(back[0]["unclipped_estimate"]) and "nonfinite" not in back[0]
    row = {"round": 3, "a": float("inf"), "b": [1.0, float("-inf"), [float("nan"), 2.0]], "c": 0.5}
    with open(tmp_path / METRICS, "a") as f:
        f.write(dumps_row(row) + "\n")
        f.write('{"round": 4, "a": NaN, "b": Infinity}\n')  # a file of the old format
    rows = read_metrics(str(tmp_path))
    assert rows[2]["a"] == math.inf and rows[2]["b"][1] == -math.inf and rows[2]["c"] == 0.5
    assert math.isnan(rows[2]["b"][2][0]) and rows[2]["b"][2][1] == 2.0
    assert math.isnan(rows[3]["a"]) and rows[3]["b"] == math.inf


def test_a_bug_in_the_loss_surfaces_before_the_ledger_is_charged(data, tmp_path):
    """A user's loss_fn that raises is caught by an abstract dry run of one round before the
    ledger is charged, so a retry with the fixed loss and the same ledger is not refused."""
    d, ids = data
    s, _ = _ftrl()

    def buggy(params, batch, rng):
        return loss_fn(params, {**batch, "x": batch["features"]}, rng)  # no such field
    kw = dict(clip_norm=0.5, noise_multiplier=1.0, expected_cohort_size=5,
              rounds_per_epoch=s.rounds_per_epoch)
    bad = dp_ftrl(buggy, optax.sgd(0.05), server_optimizer("sgd", 1.0), **kw)
    led = PrivacyLedger(100.0, 1e-6)
    with pytest.raises(KeyError, match="features"):
        train(bad, init_params(), d, ids, s, rounds=3, ledger=led, **_kw(tmp_path))
    assert led.entries == [] and load_run(str(tmp_path)) is None
    good = dp_ftrl(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), **kw)
    res = train(good, init_params(), d, ids, s, rounds=3, ledger=led, **_kw(tmp_path))
    assert [e.name for e in led.entries] == ["fl-training"] and int(res.state.round) == 3
    # extending on resume is charged after the same dry run
    with pytest.raises(KeyError, match="features"):
        train(bad, init_params(), d, ids, s, rounds=6, ledger=led, **_kw(tmp_path))
    assert led.entry("fl-training").details["rounds"] == 3


def test_metrics_one_row_per_round_after_crash_before_checkpoint_and_torn_line(data, tmp_path):
    d, ids = data
    s, alg = _ftrl()
    kw = _kw(tmp_path, checkpoint_every=3, nonprivate_ok=True)

    def crash_at(r):
        def fn(p):
            if crash[0] == r:
                raise KeyboardInterrupt("crash")
            crash[0] += 1
            return {"w0": float(p["w"][0])}
        return fn

    crash = [1]
    with pytest.raises(KeyboardInterrupt):  # crash at round 2, before the first checkpoint
        train(alg, init_params(), d, ids, s, rounds=7, eval_fn=crash_at(2), eval_every=1, **kw)
    assert [r["round"] for r in _rows(tmp_path)] == [1] and load_run(str(tmp_path)) is None
    crash = [1]
    with pytest.raises(KeyboardInterrupt):  # crash at round 5, after the checkpoint of round 3
        train(alg, init_params(), d, ids, s, rounds=7, eval_fn=crash_at(5), eval_every=1, **kw)
    assert [r["round"] for r in _rows(tmp_path)] == [1, 2, 3, 4]
    with open(tmp_path / METRICS, "a") as f:  # a torn last line (killed mid-write)
        f.write('{"round": 5, "train_lo')
    assert [r["round"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4]
    crash = [1]
    train(alg, init_params(), d, ids, s, rounds=7, eval_fn=crash_at(-1), eval_every=1, **kw)
    assert [r["round"] for r in _rows(tmp_path)] == list(range(1, 8))
    ref = train(alg, init_params(), d, ids, s, rounds=7, eval_fn=lambda p: {"w0": float(p["w"][0])},
                eval_every=1, **_kw(tmp_path / "ref", nonprivate_ok=True))
    assert _rows(tmp_path) == _rows(tmp_path / "ref") and len(ref.history) == 7


def test_fork_and_pipeline_api(data, tmp_path):
    d, ids = data
    s, alg = _ftrl()
    src, dst = tmp_path / "src", tmp_path / "dst"
    train(alg, init_params(), d, ids, s, rounds=6, stop_after=3, ledger=PrivacyLedger(1e6, 1e-6),
          **_kw(src))
    fork_run(str(src), str(dst))
    a = train(alg, init_params(), d, ids, s, rounds=6, **_kw(src))
    b = train(alg, init_params(), d, ids, s, rounds=6, **_kw(dst))
    _leaves_equal(a.state.params, b.state.params)
    assert b.resumed_from == 3 and _rows(src) == _rows(dst)
    with pytest.raises(CheckpointError, match="already holds"):
        fork_run(str(src), str(dst))
    # nothing outside fedpriv/fl touches checkpoint files or orbax
    for dirpath, _, files in os.walk(os.path.join(ROOT, "fedpriv")):
        if os.path.join("fedpriv", "fl") in dirpath:
            continue
        for f in files:
            if f.endswith(".py"):
                src_text = open(os.path.join(dirpath, f)).read()
                assert "import orbax" not in src_text and "checkpoint.msgpack" not in src_text, f


# ------------------------------------------------------------------ keys carry their purpose
def test_stage_tag_gives_independent_noise_and_same_stage_reproduces(tmp_path):
    dim = 64
    d = make_dataset(num_clients=20, dim=dim, seed=0)
    ids = list(d)
    s = ShuffledPassSampler(20, 5, seed=0)
    # tiny clip, large noise: the update is essentially the noise
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=1e-6,
                    noise_multiplier=1.0, expected_cohort_size=5)
    kw = dict(rounds=1, batch_size=4, seed=0, progress=False, nonprivate_ok=True, log=None)
    w = {t: np.asarray(train(alg, init_params(dim), d, ids, s, stage=t, **kw).state.params["w"])
         for t in ("row-a", "row-b")}
    again = np.asarray(train(alg, init_params(dim), d, ids, s, stage="row-a", **kw).state.params["w"])
    np.testing.assert_array_equal(w["row-a"], again)
    corr = np.corrcoef(w["row-a"], w["row-b"])[0, 1]
    assert abs(corr) < 0.5, corr  # independent draws (same key: corr = 1)
    assert not np.allclose(w["row-a"], w["row-b"])


# ------------------------------------------------------------------ kill -9
KILL_SCRIPT = textwrap.dedent("""
    import os, sys, json, signal, time
    sys.path.insert(0, os.environ["FEDPRIV_ROOT"])
    import numpy as np, optax
    from fedpriv.dp.adaptive import AdaptiveClipping
    from fedpriv.dp.ledger import PrivacyLedger
    from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
    from fedpriv.fl.loop import train
    from fedpriv.fl.samplers import ShuffledPassSampler
    from tests.fl.helpers import init_params, loss_fn, make_dataset
    wd, out, mode, at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    data = make_dataset(num_clients=30, seed=4); ids = list(data)
    s = ShuffledPassSampler(30, 5, seed=3)
    alg = dp_ftrl(loss_fn, optax.sgd(0.05), server_optimizer("sgdm", 0.5), clip_norm=0.5,
                  noise_multiplier=0.8, expected_cohort_size=5, rounds_per_epoch=s.rounds_per_epoch,
                  adaptive=AdaptiveClipping(initial_clip=0.5, count_stddev=0.5))
    if mode == "in-save":  # die inside the commit of round `at`: state item written, meta not
        import orbax.checkpoint as ocp
        H = ocp.handlers.JsonCheckpointHandler
        orig = H.async_save
        async def async_save(self, directory, *a, **k):
            args = k.get("args") or (a[0] if a else None)
            if getattr(args, "item", {}).get("round") == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return await orig(self, directory, *a, **k)
        H.async_save = async_save
    def log_fn(row):
        if mode == "self" and row["round"] == at:  # die after the round, before its metrics row
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "torn" and row["round"] == at:  # die mid-way through writing a metrics line
            with open(os.path.join(wd, "metrics.jsonl"), "a") as f:
                f.write(json.dumps(row)[:17])
            os.kill(os.getpid(), signal.SIGKILL)
        print("R", row["round"], flush=True)
        time.sleep(float(os.environ.get("FEDPRIV_TEST_SLOW", "0")))  # lets an external kill land
    res = train(alg, init_params(), data, ids, s, rounds=12, batch_size=4, seed=5, max_steps=6,
                workdir=wd, checkpoint_every=3, ledger=PrivacyLedger(1e4, 1e-6), progress=False,
                log_fn=log_fn, eval_fn=lambda p: {"w0": float(p["w"][0])}, eval_every=4, log=None)
    np.savez(out, **{k: np.asarray(v) for k, v in res.state.params.items()},
             spent=res.ledger.spent(), entries=len(res.ledger.entries))
    print("DONE", flush=True)
""")


def _child(script, wd, out, mode="none", at=0, kill_after_round=None):
    env = dict(os.environ, FEDPRIV_ROOT=ROOT, JAX_PLATFORMS="cpu",
               FEDPRIV_TEST_SLOW="0.3" if kill_after_round is not None else "0")
    p = subprocess.Popen([sys.executable, str(script), str(wd), str(out), mode, str(at)], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if kill_after_round is not None and line.split() == ["R", str(kill_after_round)]:
            p.send_signal(signal.SIGKILL)  # an external kill -9, wherever the child is by now
            break
    p.wait(timeout=300)
    return p.returncode, p.stderr.read()


def test_kill9_anywhere_resumes_bit_identical_with_one_metrics_row_per_round(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(KILL_SCRIPT)
    rc, err = _child(script, tmp_path / "ref", tmp_path / "ref.npz")
    assert rc == 0, err[-2000:]
    ref = np.load(tmp_path / "ref.npz")
    wd = tmp_path / "run"
    rng = np.random.default_rng()
    kills = [dict(mode="self", at=2),                       # before the first checkpoint (round 3)
             dict(mode="in-save", at=6),                    # inside a commit
             dict(mode="torn", at=int(rng.integers(7, 9))),  # a half-written metrics line
             dict(kill_after_round=int(rng.integers(9, 12)))]
    for k in kills:
        rc, err = _child(script, wd, tmp_path / "x.npz", **k)
        assert rc == -signal.SIGKILL, (k, rc, err[-2000:])
        if k.get("mode") == "self":  # row 1 was logged, no checkpoint yet
            assert load_run(str(wd)) is None and len(_rows(wd)) == 1
        if k.get("mode") == "in-save":  # the half-written commit of round 6 is not a checkpoint
            assert any("tmp" in n for n in os.listdir(wd / CHECKPOINTS))
            assert load_run(str(wd)).round == 3
    rc, err = _child(script, wd, tmp_path / "out.npz")
    assert rc == 0, err[-2000:]
    out = np.load(tmp_path / "out.npz")
    for k in ("w", "b"):
        np.testing.assert_array_equal(out[k], ref[k])
    assert float(out["spent"]) == float(ref["spent"]) and int(out["entries"]) == 1
    rows = _rows(wd)
    assert [r["round"] for r in rows] == list(range(1, 13))
    assert rows == _rows(tmp_path / "ref")


def test_an_unfinished_commit_is_cleared_before_the_next_one(tmp_path, monkeypatch):
    """A commit that never finished (killed, or a failed write whose array writer was still
    finishing) leaves ``<k>.orbax-checkpoint-tmp``: it is removed synchronously before the next
    manager writes (orbax's asynchronous cleanup raced with such a writer: ENOENT), the next
    commit lands, and a leftover that keeps coming back is refused in one line."""
    from fedpriv.fl import checkpoint as C
    d = str(tmp_path / "ck")
    ck = Checkpointer(d)
    ck.save({"w": np.ones(3, np.float32)}, {"round": 1})
    ck.close()
    junk = os.path.join(d, "1.orbax-checkpoint-tmp", "state", "ocdbt.process_0")
    os.makedirs(junk)
    open(os.path.join(junk, "part"), "w").close()
    ck = Checkpointer(d)
    assert ck.save({"w": np.full(3, 2.0, np.float32)}, {"round": 2}) == 1
    assert not [n for n in os.listdir(d) if "orbax-checkpoint-tmp" in n]
    state, meta = ck.restore({"w": np.zeros(3, np.float32)})
    assert meta["round"] == 2 and float(state["w"][0]) == 2.0
    ck.close()
    os.makedirs(os.path.join(d, "2.orbax-checkpoint-tmp"))
    monkeypatch.setattr(C.shutil, "rmtree", lambda *a, **k: None)  # a writer that recreates it
    with pytest.raises(C.CheckpointWriteError, match="keep coming back"):
        C._clear_unfinished(d, settle=0.0, tries=3)


# ------------------------------------------------------------------ issue 54: resume and stages
def _covers_every_round_run(wd, ledger, alg, s, stage="fl-training"):
    """The run in ``wd`` never ran a round it was not charged for: its checkpoint's ledger and
    the caller's hold the event of ``n`` rounds (``n`` = the entry's recorded rounds = the
    checkpoint's charged rounds) with ``n`` >= the rounds run (state and metrics rows)."""
    run = load_run(str(wd))
    rows = [r["round"] for r in _rows(wd)]
    assert rows == list(range(1, run.round + 1))
    for led in (run.ledger, ledger):
        entry = led.entry(stage)
        n = entry.details["rounds"]
        assert run.round <= n == run.charged_rounds, (run.round, n, run.charged_rounds)
        assert event_to_json(entry.event) == event_to_json(privacy_event(alg.dp, s, n))
    return run.round, run.charged_rounds


@pytest.mark.parametrize("first,then", [(3, 4), (4, 5), (3, 9)])
def test_a_resumed_run_never_runs_a_round_it_was_not_charged_for(data, tmp_path, first, then):
    """Interrupted, resumed, then extended (by one round, or more): after every call the rounds
    run are covered by the ledger's charge, in the checkpoint and in the caller's ledger; the
    extension is charged before it runs."""
    d, ids = data
    s, alg = _ftrl()
    wd = tmp_path / "run"
    led = PrivacyLedger(1e6, 1e-6)
    train(alg, init_params(), d, ids, s, rounds=first, stop_after=2, ledger=led, **_kw(wd))
    assert _covers_every_round_run(wd, led, alg, s) == (2, first)
    led = PrivacyLedger(1e6, 1e-6)
    train(alg, init_params(), d, ids, s, rounds=first, ledger=led, **_kw(wd))
    assert _covers_every_round_run(wd, led, alg, s) == (first, first)
    led = PrivacyLedger(1e6, 1e-6)
    res = train(alg, init_params(), d, ids, s, rounds=then, ledger=led, **_kw(wd))
    assert _covers_every_round_run(wd, led, alg, s) == (then, then) == (int(res.state.round), res.charged_rounds)
    assert led.spent() == pytest.approx(compute_epsilon(privacy_event(alg.dp, s, then), 1e-6)[0])


def test_two_runs_with_one_stage_name_in_one_ledger_are_refused(data, tmp_path):
    """The stage name tags the run's noise keys: a second train() call under a stage name the
    ledger already holds would draw the first run's noise on the same users. Refused before it
    runs (ledger and workdir untouched), with or without a workdir; another name is accepted."""
    d, ids = data
    s, alg = _ftrl()
    led = PrivacyLedger(1e6, 1e-6)
    train(alg, init_params(), d, ids, s, rounds=2, ledger=led, **_kw(tmp_path / "a"))
    before = led.to_dict()
    for wd in (tmp_path / "b", None):
        with pytest.raises(PrivacyAccountingError, match="already has an entry 'fl-training'"):
            train(alg, init_params(), d, ids, s, rounds=2, ledger=led, **_kw(wd))
        assert led.to_dict() == before
    assert not os.path.exists(tmp_path / "b" / METRICS) and load_run(str(tmp_path / "b")) is None
    train(alg, init_params(), d, ids, s, rounds=2, ledger=led, stage="second", **_kw(tmp_path / "c"))
    assert [e.name for e in led.entries] == ["fl-training", "second"]


def test_a_resumed_run_naming_other_populations_is_refused(data, tmp_path):
    """The checkpoint charged the run's rounds to population S: resuming it under other ledger
    populations (T, or S and T) would train on users whose charge sits elsewhere. Refused, even
    when asked to resume anyway; the charge stays on S and the same populations resume."""
    d, ids = data
    s, alg = _ftrl()
    wd = tmp_path / "run"
    train(alg, init_params(), d, ids, s, rounds=4, stop_after=2, ledger=PrivacyLedger(1e6, 1e-6),
          populations=("S",), **_kw(wd))
    for pops in (("T",), ("S", "T")):
        for anyway in ((), ("populations",)):
            led = PrivacyLedger(1e6, 1e-6)
            with pytest.raises(ResumeMismatch, match="populations"):
                train(alg, init_params(), d, ids, s, rounds=4, ledger=led, populations=pops,
                      **_kw(wd, resume_anyway=list(anyway)))
            assert led.entries == []
    assert load_run(str(wd)).round == 2
    assert load_run(str(wd)).ledger.entry("fl-training").populations == ("S",)
    led = PrivacyLedger(1e6, 1e-6)
    res = train(alg, init_params(), d, ids, s, rounds=4, ledger=led, populations=("S",), **_kw(wd))
    assert int(res.state.round) == 4 and led.entry("fl-training").populations == ("S",)


def test_an_empty_poisson_round_releases_the_accounted_noise(tmp_path):
    """The Poisson event charges a noisy release every round, also when no client is sampled:
    the round's update is then exactly the privatizer's noise for that round (its key, at
    multiplier z, times C / expected cohort) -- and it is noise of that std, not zero."""
    dim, n, q, z, clip = 200, 30, 0.05, 1.0, 1.0
    d = make_dataset(num_clients=n, dim=dim, seed=3)
    ids = list(d)
    s = PoissonSampler(n, q, seed=0)
    r = next(t for t in range(1, 40) if s.sample(t).size == 0)  # the first empty round after 0
    m = s.expected_cohort_size
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=clip,
                    noise_multiplier=z, expected_cohort_size=m)
    kw = dict(batch_size=4, seed=1, max_steps=1, progress=False, log=None)
    before = train(alg, init_params(dim), d, ids, s, rounds=r, nonprivate_ok=True, **kw).state
    led = PrivacyLedger(1e6, 1e-6)
    after = train(alg, init_params(dim), d, ids, s, rounds=r + 1, ledger=led, **kw)
    assert after.history[r]["nonprivate/num_clients"] == 0
    assert event_to_json(led.entry("fl-training").event) == event_to_json(privacy_event(alg.dp, s, r + 1))
    zero = jax.tree_util.tree_map(np.zeros_like, before.params)
    noise, _ = alg.dp.privatizer(z).update(zero, before.noise_state)
    flat = lambda t: np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(t)])  # noqa: E731
    step = flat(after.state.params) - flat(before.params)
    np.testing.assert_allclose(step, flat(noise) * clip / m, rtol=1e-5, atol=1e-7)
    std = z * clip / m  # the accounted noise on the average (sum std z C over m)
    assert abs(np.std(step) / std - 1) < 0.2, (np.std(step), std)


def test_a_checkpoint_ledger_accounted_otherwise_is_never_merged(data, tmp_path):
    """The checkpoint's ledger was charged at delta 1e-6, add/remove, per user: a caller's
    ledger at another delta, relation or unit cannot take its entries as its own (their epsilon
    would be read under the wrong accounting). Refused before anything runs, the caller's
    ledger untouched; the recorded accounting resumes."""
    d, ids = data
    s, alg = _ftrl()
    wd = tmp_path / "run"
    train(alg, init_params(), d, ids, s, rounds=4, stop_after=2, ledger=PrivacyLedger(1e6, 1e-6),
          **_kw(wd))
    for field, kw in (("delta", dict(delta=1e-5)), ("neighboring", dict(neighboring="replace_one")),
                      ("unit", dict(unit="sample"))):
        led = PrivacyLedger(1e6, **{"delta": 1e-6, **kw})
        led.spend("earlier release", dpa.GaussianDpEvent(5.0))
        before = led.to_dict()
        with pytest.raises(PrivacyBudgetExceeded, match=f"{field}=.*cannot be combined"):
            train(alg, init_params(), d, ids, s, rounds=4, ledger=led, **_kw(wd))
        assert led.to_dict() == before
    assert load_run(str(wd)).round == 2
    led = PrivacyLedger(1e6, 1e-6)
    train(alg, init_params(), d, ids, s, rounds=4, ledger=led, **_kw(wd))
    assert [e.name for e in led.entries] == ["fl-training"] and load_run(str(wd)).round == 4
