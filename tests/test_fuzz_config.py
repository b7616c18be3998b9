"""Property-based fuzzing (hypothesis) of the config parser and the command lines (issue 24).

Property: any input either parses to a valid, typed value or is refused with the project's
one-line error -- ``ConfigError`` for the config parser (``configs/common.py``: ``parse_value``,
``apply_overrides``, ``split_spec``, ``from_scale``), exit status 2 with exactly one
``error: ...`` line on stderr for ``fedpriv privacy`` / ``fedpriv audit``. Never another
exception type, never a traceback, never a silently truncated value. Example counts are kept
modest (suite time); each test runs in a few seconds.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import (  # noqa: E402
    HealthCheck,
    given,
    settings,
    strategies as st,
)

from configs import common, lm_fl  # noqa: E402
from configs.common import ConfigError  # noqa: E402

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# text that looks like values: numbers in every spelling, booleans, none, tuples, junk
_WORDS = ["true", "false", "yes", "no", "on", "none", "None", "nan", "inf", "-inf", "1e3", "0x10",
          "1_000", "2.5", "-1", "0", "1", "", " ", "/", "a/b", "1/2/3", "0.8/0.1/0.1", "=", ",",
          "99999999999999999999", "1e400", "١٢", "½", "\x00", "é"]
value_text = st.one_of(st.sampled_from(_WORDS), st.text(max_size=12),
                       st.integers(-10**25, 10**25).map(str),
                       st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.lists(st.sampled_from(["1", "2.5", "x", "", "none", "-3"]), min_size=1,
                                max_size=4).map("/".join))

_KINDS = [("bool", True), ("int", 3), ("float", 0.5), ("str", "abc"), ("int | None", None),
          ("float | None", 1.0), ("str | None", None), ("tuple", (1, 2)), ("tuple", (0.5, 0.5)),
          ("tuple", ("a", "b")), ("tuple | None", None)]


def _one_line(err: Exception) -> None:
    assert str(err) and len(str(err).splitlines()) == 1, repr(err)


@FAST
@given(kind=st.sampled_from(_KINDS), text=value_text)
def test_parse_value_gives_a_typed_value_or_a_config_error(kind, text):
    annotation, current = kind
    try:
        v = common.parse_value(current, annotation, text, "field")
    except ConfigError as err:
        _one_line(err)
        return
    if text.strip().lower() == "none" and "None" in annotation:
        assert v is None
        return
    if annotation.startswith("bool"):
        assert isinstance(v, bool)
    elif annotation.startswith("int"):
        assert isinstance(v, int) and not isinstance(v, bool) and str(v) == str(int(text.strip()))
    elif annotation.startswith("float"):
        assert isinstance(v, float) and not math.isnan(v)
    elif annotation.startswith("str"):
        assert v == text
    else:  # tuples: elements of the current elements' type
        assert isinstance(v, tuple)
        elem = type(current[0]) if current else str
        assert all(isinstance(x, elem) and not isinstance(x, bool) or elem is str for x in v)


@FAST
@given(arg=st.one_of(st.none(), st.text(max_size=30),
                     st.lists(st.sampled_from(["smoke", "small", "rounds=3", "", " ", "=", "a=b=c",
                                               ",", "x"]), max_size=5).map(",".join)))
def test_split_spec_gives_a_scale_and_overrides_or_a_config_error(arg):
    try:
        scale, overrides = common.split_spec(arg, "small")
    except ConfigError as err:
        _one_line(err)
        return
    assert isinstance(scale, str) and scale and "=" not in scale and "," not in scale
    assert all(isinstance(o, str) and o.strip() and "," not in o for o in overrides)


_FIELDS = [f.name for f in dataclasses.fields(lm_fl.LMFLConfig)]
override = st.tuples(st.one_of(st.sampled_from(_FIELDS), st.text(max_size=8)), value_text).map(
    lambda kv: f"{kv[0]}={kv[1]}".replace(",", ""))


@FAST
@given(scale=st.sampled_from(["smoke", "small", "paper", "huge", ""]),
       overrides=st.lists(override, max_size=4))
def test_lm_fl_specs_give_a_valid_config_or_a_config_error(scale, overrides):
    spec = ",".join([scale, *overrides])
    try:
        cfg = lm_fl.get_config(spec)
    except ConfigError as err:
        _one_line(err)
        return
    assert isinstance(cfg, lm_fl.LMFLConfig)
    common.check_types(cfg)  # every field its annotated type
    assert not (cfg.noise_multiplier is not None and cfg.target_epsilon is not None)
    assert dataclasses.replace(cfg) == cfg  # and it re-validates


@FAST
@given(overrides=st.lists(override, max_size=4))
def test_apply_overrides_is_order_independent(overrides):
    """All overrides of a spec apply together: any order gives the same config or the same
    refusal class (the first error found may differ)."""
    base = lm_fl.get_config("smoke")
    results = []
    for ovs in (overrides, list(reversed(overrides))):
        try:
            results.append(common.apply_overrides(base, ovs, scale="smoke",
                                                  scale_fields=set(lm_fl.SCALES["smoke"])))
        except ConfigError as err:
            _one_line(err)
            results.append(ConfigError)
    if ConfigError not in results:
        assert results[0] == results[1]


# ----------------------------------------------------------------------------- command lines
_PRIV_FLAGS = ["--noise-multiplier", "--sampling-rate", "--rounds", "--delta", "--rounds-per-epoch",
               "--accountant", "--epsilon", "--json", "--bogus"]
_CLI_VALUES = ["1", "0.5", "10", "1e-6", "0", "-1", "nan", "inf", "1e300", "2.5", "rdp", "pld",
               "best", "x", "", "99999999999999999999", "-.5", "=", "--json"]
cli_value = st.one_of(st.sampled_from(_CLI_VALUES), st.text(max_size=6))
_HEADS = [["privacy", "dp-ftrl"], ["privacy", "dp-fedavg"], ["privacy", "calibrate", "dp-ftrl"],
          ["privacy", "calibrate", "dp-fedavg"], ["privacy"], ["bogus"], []]


def _bounded(argv):
    """Keep accounting cheap: no example asks for more than 50 rounds or a PLD calibration."""
    out = list(argv)
    for i, tok in enumerate(out[:-1]):
        if tok == "--rounds":
            try:
                if int(out[i + 1]) > 50:
                    out[i + 1] = "50"
            except ValueError:
                pass
    if "calibrate" in out and "pld" in out:
        out = [t if t != "pld" else "rdp" for t in out]
    return out


def _call_cli(main, argv, capsys):
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(head=st.sampled_from(_HEADS),
       rest=st.lists(st.one_of(st.sampled_from(_PRIV_FLAGS), cli_value), max_size=10))
def test_privacy_cli_answers_or_refuses_in_one_line(head, rest, capsys):
    from fedpriv.cli import main
    rc, out = _call_cli(main, _bounded(head + rest), capsys)
    assert "Traceback" not in out.err
    if rc == 0:
        assert out.out.strip() and not out.err.strip()
    else:
        assert rc == 2, (head + rest, rc, out.err)
        lines = [ln for ln in out.err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), out.err


_AUDIT_FLAGS = ["--mechanism", "--variants", "--noise-multiplier", "--rounds", "--dim", "--clients",
                "--canaries", "--heldout", "--sampling-rate", "--cohort-size", "--clip-norm",
                "--canary-norm", "--delta", "--seed", "--json"]


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rest=st.lists(st.one_of(st.sampled_from(_AUDIT_FLAGS), cli_value), max_size=10))
def test_audit_cli_arguments_are_planned_or_refused_in_one_line(rest, capsys):
    """``fedpriv audit`` argument handling: ``plan`` parses and validates every setting before
    any engine run (``main`` prints an ``AuditError`` as one ``error:`` line, status 2)."""
    from fedpriv.audit import cli as audit_cli
    capsys.readouterr()
    try:
        audit_cli.plan(rest)
    except SystemExit as e:
        out = capsys.readouterr()
        assert e.code in (0, 2), e.code
        if e.code == 2:
            lines = [ln for ln in out.err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("error:"), out.err
    except audit_cli.AuditError as err:
        _one_line(err)


def test_none_is_an_element_of_a_tuple_that_cannot_be_none():
    """``public_training``'s ``rows=none`` (the no-public-data row) and ``rows=none/pretrain_lm``
    parse as row names; a ``tuple | None`` field's ``none`` stays None; an int tuple refuses it."""
    assert common.parse_value(("none", "pretrain_lm"), "tuple", "none", "rows") == ("none",)
    assert common.parse_value(("none",), "tuple", "none/pretrain_lm", "rows") == ("none", "pretrain_lm")
    assert common.parse_value(None, "tuple | None", "none", "archs") is None
    with pytest.raises(ConfigError, match="expected an integer"):
        common.parse_value((1, 2), "tuple", "none", "seeds")
    from configs import public_training
    cfg = public_training.get_config("smoke,rows=none")
    assert cfg.rows == ("none",)


def test_a_tuple_field_that_defaults_to_none_takes_its_element_type_from_the_annotation():
    """A None default has no element to read the type from: ``tuple[float, ...] | None`` gives
    floats (privacy_utility's server_lrs=0.05/0.2 had crashed with a TypeError on strings)."""
    assert common.parse_value(None, "tuple[float, ...] | None", "0.05/0.2", "lrs") == (0.05, 0.2)
    assert common.parse_value(None, "tuple[int, ...] | None", "1/2", "seeds") == (1, 2)
    assert common.parse_value(None, "tuple[float, ...] | None", "none", "lrs") is None
    with pytest.raises(ConfigError, match="expected a number"):
        common.parse_value(None, "tuple[float, ...] | None", "0.05/fast", "lrs")
    from experiments.common import load_config
    assert load_config("configs/privacy_utility.py:small,server_lrs=0.05/0.2").server_lrs == (0.05, 0.2)
    assert load_config("configs/public_training.py:small,archs=lstm/transformer,server_lr=0.05,"
                       "student_server_lrs=0.05/0.02").student_server_lrs == (0.05, 0.02)
    for bad, why in (("configs/privacy_utility.py:small,server_lrs=0.05/inf", "finite"),
                     ("configs/privacy_utility.py:small,server_lrs=0.05/x", "expected a number"),
                     ("configs/public_training.py:small,archs=lstm/transformer,server_lr=0.05,student_server_lrs=0.05/x",
                      "expected a number")):
        with pytest.raises(ConfigError, match=why):
            load_config(bad)
    # the per-epsilon form parses alike (one student; server_lr is its first)
    cfg = load_config("configs/public_training.py:small,epsilon_server_lrs=0.5/0.2,server_lr=0.5")
    assert cfg.epsilon_server_lrs == (0.5, 0.2)
    with pytest.raises(ConfigError, match="finite"):
        load_config("configs/public_training.py:small,epsilon_server_lrs=0.5/inf,server_lr=0.5")
