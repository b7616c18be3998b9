"""The stage mechanism: one ledger through a list of stages, resumable per stage, fail closed."""
import json
import os

import dp_accounting as dpa
import pytest

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.checkpoint import ResumeMismatch
from fedpriv.fl.stages import STATE, Stage, run_stages


class Crash(RuntimeError):
    pass


def _pipeline(calls, crash_in=None):
    def release(ctx):
        calls.append(ctx.name)
        ctx.ledger.spend(ctx.name, dpa.GaussianDpEvent(5.0), ("users",))
        return {"value": 1.5}

    def train(ctx):
        calls.append(ctx.name)
        if crash_in == ctx.name:
            ctx.ledger.spend("partial", dpa.GaussianDpEvent(5.0), ("users",))  # charged, never committed
            raise Crash
        assert ctx.results["release"] == {"value": 1.5}
        assert os.path.isdir(ctx.workdir) and ctx.dir("release") != ctx.workdir
        return {"trained_on": ctx.results["release"]["value"] * 2}

    return [Stage("release", release), Stage("train", train)]


def test_runs_in_order_and_threads_one_ledger(tmp_path):
    calls, led = [], PrivacyLedger(10.0, 1e-6)
    out = run_stages(_pipeline(calls), str(tmp_path), led, fingerprint={"seed": 0}, log=lambda _: None)
    assert calls == ["release", "train"]
    assert out.results == {"release": {"value": 1.5}, "train": {"trained_on": 3.0}}
    assert out.ledger is led and [e.name for e in led.entries] == ["release"]
    state = json.load(open(tmp_path / STATE))
    assert state["stages"] == ["release", "train"] and len(state["ledger"]["entries"]) == 1


def test_resume_skips_done_stages_and_charges_once(tmp_path):
    calls = []
    with pytest.raises(Crash):
        run_stages(_pipeline(calls, crash_in="train"), str(tmp_path), PrivacyLedger(10.0, 1e-6),
                   fingerprint={"seed": 0}, log=lambda _: None)
    calls2, led = [], PrivacyLedger(10.0, 1e-6)
    out = run_stages(_pipeline(calls2), str(tmp_path), led, fingerprint={"seed": 0}, log=lambda _: None)
    assert calls2 == ["train"] and out.resumed == ["release"]
    # the release's charge came from the file; the crashed attempt's uncommitted charge is gone
    assert [e.name for e in led.entries] == ["release"]
    fresh = PrivacyLedger(10.0, 1e-6)
    run_stages(_pipeline([]), str(tmp_path / "fresh"), fresh, fingerprint={"seed": 0}, log=lambda _: None)
    assert led.spent() == pytest.approx(fresh.spent())


def test_refuses_other_config_stages_or_budget(tmp_path):
    run_stages(_pipeline([]), str(tmp_path), PrivacyLedger(10.0, 1e-6), fingerprint={"seed": 0},
               log=lambda _: None)
    with pytest.raises(ResumeMismatch, match="seed"):
        run_stages(_pipeline([]), str(tmp_path), PrivacyLedger(10.0, 1e-6), fingerprint={"seed": 1})
    with pytest.raises(ResumeMismatch, match="stages"):
        run_stages(_pipeline([])[:1], str(tmp_path), PrivacyLedger(10.0, 1e-6), fingerprint={"seed": 0})
    with pytest.raises(ResumeMismatch, match="epsilon"):
        run_stages(_pipeline([]), str(tmp_path), PrivacyLedger(20.0, 1e-6), fingerprint={"seed": 0})
    (tmp_path / STATE).write_text("{not json")
    with pytest.raises(ResumeMismatch, match="not a readable"):
        run_stages(_pipeline([]), str(tmp_path), PrivacyLedger(10.0, 1e-6), fingerprint={"seed": 0})


def test_names_must_be_unique(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        run_stages(_pipeline([]) * 2, str(tmp_path), PrivacyLedger(10.0, 1e-6))


def test_a_resumed_pipeline_continues_only_under_the_recorded_accounting(tmp_path):
    """Issue 54: the recorded entries were charged under the recorded ledger's budget, delta,
    relation, unit and accountant; resuming them under a ledger that differs in any one of these
    would bound (and report) another epsilon for the same releases. Refused before any stage
    runs, the caller's ledger left empty; the recorded accounting resumes."""
    recorded = dict(epsilon=10.0, delta=1e-6, neighboring="add_remove", unit="user", accountant="rdp")
    other = dict(epsilon=20.0, delta=1e-5, neighboring="replace_one", unit="sample", accountant="best")
    with pytest.raises(Crash):
        run_stages(_pipeline([], crash_in="train"), str(tmp_path), PrivacyLedger(**recorded),
                   fingerprint={"seed": 0}, log=lambda _: None)
    for field, value in other.items():
        calls, led = [], PrivacyLedger(**{**recorded, field: value})
        with pytest.raises(ResumeMismatch, match=field):
            run_stages(_pipeline(calls), str(tmp_path), led, fingerprint={"seed": 0}, log=lambda _: None)
        assert calls == [] and led.entries == []
    calls, led = [], PrivacyLedger(**recorded)
    run_stages(_pipeline(calls), str(tmp_path), led, fingerprint={"seed": 0}, log=lambda _: None)
    assert calls == ["train"] and [e.name for e in led.entries] == ["release"]
