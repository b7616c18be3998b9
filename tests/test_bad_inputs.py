"""Bad input fails closed with a one-line error (issue 14, items 6-8).

Every case feeds fedpriv one malformed or hostile input and asserts both the refusal (the
exception class, or an experiment's exit status 2) and the message naming the problem. Nothing
here trains a model: the experiment cases must fail before any training.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import sqlite3
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import common
from fedpriv.data import (
    EmptyCorpusError,
    MalformedDataError,
    MissingResourceError,
    SentencePieceTokenizer,
    WordTokenizer,
    load_chitchat,
    load_jsonl,
    load_stackoverflow_sqlite,
    load_text_dir,
    load_tokenizer,
    train_sentencepiece,
)
from fedpriv.data.errors import ConfigError, FedprivError, TokenizerError
from fedpriv.dp.clipping import clip_update
from fedpriv.fl.cohort import build_cohort
from fedpriv.fl.samplers import PoissonSampler, ShuffledPassSampler, UniformSampler

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))


def _jsonl(path: pathlib.Path, lines: list[bytes]) -> pathlib.Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


# --------------------------------------------------------------------------------------------
# Loaders: invalid bytes never merge users (item 6)
# --------------------------------------------------------------------------------------------

def test_jsonl_invalid_utf8_user_ids_are_not_merged(tmp_path):
    """Two users whose ids are different invalid UTF-8 bytes must not become one client."""
    p = _jsonl(tmp_path / "u.jsonl", [b'{"user": "\xff", "text": "secret of user ff"}',
                                      b'{"user": "\xfe", "text": "secret of user fe"}',
                                      b'{"user": "ok", "text": "a valid record"}'])
    corpus = load_jsonl(p, progress=False)
    assert list(corpus.client_ids) == ["ok"]
    assert corpus.stats.malformed == 2
    assert not any("\ufffd" in t for t in corpus.texts())


def test_jsonl_invalid_utf8_text_is_counted_malformed(tmp_path):
    p = _jsonl(tmp_path / "t.jsonl", [b'{"user": "a", "text": "caf\xe9 au lait"}',
                                      b'{"user": "a", "text": "fine"}'])
    corpus = load_jsonl(p, progress=False)
    assert corpus.stats.malformed == 1 and corpus.texts() == ["fine"]


def test_jsonl_only_invalid_bytes_is_refused(tmp_path):
    p = _jsonl(tmp_path / "bad.jsonl", [b'{"user": "\xff", "text": "x"}',
                                        b'{"user": "\xfe", "text": "y"}'])
    with pytest.raises(EmptyCorpusError, match=r"2 malformed"):
        load_jsonl(p, progress=False)


def test_jsonl_invalid_bytes_count_against_max_malformed(tmp_path):
    p = _jsonl(tmp_path / "m.jsonl", [b'{"user": "a", "text": "ok"}',
                                      b'{"user": "b\x80", "text": "ok"}'])
    with pytest.raises(MalformedDataError, match=r"1 malformed records out of 2 .*max_malformed=0"):
        load_jsonl(p, progress=False, max_malformed=0)


def test_jsonl_lone_surrogate_escape_is_malformed(tmp_path):
    """``"\\udc80"`` is valid JSON but not Unicode text: counted, never a client id."""
    p = _jsonl(tmp_path / "s.jsonl", [b'{"user": "\\udc80", "text": "x"}',
                                      b'{"user": "a", "text": "\\ud800 lone"}',
                                      b'{"user": "a", "text": "fine"}'])
    corpus = load_jsonl(p, progress=False)  # default: cached, so the cache write must not crash
    assert list(corpus.client_ids) == ["a"] and corpus.stats.malformed == 2


def test_jsonl_number_and_string_ids_that_collide_are_refused(tmp_path):
    p = _jsonl(tmp_path / "c.jsonl", [b'{"user": 7, "text": "from the number"}',
                                      b'{"user": "7", "text": "from the string"}'])
    with pytest.raises(MalformedDataError, match=r"user id '7' appears both as a number and as a string"):
        load_jsonl(p, progress=False)


def test_jsonl_float_and_bool_ids_are_malformed(tmp_path):
    p = _jsonl(tmp_path / "f.jsonl", [b'{"user": 1.0, "text": "x"}', b'{"user": true, "text": "y"}',
                                      b'{"user": 1, "text": "z"}'])
    corpus = load_jsonl(p, progress=False)
    assert list(corpus.client_ids) == ["1"] and corpus.stats.malformed == 2


def test_jsonl_missing_file_names_the_path(tmp_path):
    with pytest.raises(MissingResourceError, match=r"JSONL file '.*nope\.jsonl' not found"):
        load_jsonl(tmp_path / "nope.jsonl", progress=False)


def test_text_dir_two_files_of_one_user_are_refused(tmp_path):
    (tmp_path / "alice.txt").write_text("hello\n")
    (tmp_path / "alice.md").write_text("other file\n")
    with pytest.raises(MalformedDataError, match=r"client id 'alice'.*alice\.md.*alice\.txt"):
        load_text_dir(tmp_path, pattern="alice.*", progress=False)


def test_text_dir_invalid_utf8_file_is_one_malformed_record(tmp_path):
    (tmp_path / "bob.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "eve.txt").write_text("fine line\n")
    corpus = load_text_dir(tmp_path, progress=False)
    assert list(corpus.client_ids) == ["eve"] and corpus.stats.malformed == 1


def test_text_dir_undecodable_file_name_is_malformed(tmp_path):
    os.close(os.open(os.path.join(os.fsencode(tmp_path), b"\xff.txt"), os.O_CREAT | os.O_WRONLY))
    with open(os.path.join(os.fsencode(tmp_path), b"\xff.txt"), "w") as f:
        f.write("text of an undecodable name\n")
    (tmp_path / "eve.txt").write_text("fine line\n")
    corpus = load_text_dir(tmp_path, progress=False)
    assert list(corpus.client_ids) == ["eve"] and corpus.stats.malformed == 1


def _so_db(path: pathlib.Path, rows) -> pathlib.Path:
    from tests.data.test_formats import _SCHEMA
    with sqlite3.connect(path) as con:
        con.executescript(_SCHEMA)
        for split, cid_sql, blob in rows:
            con.execute(f"INSERT INTO examples VALUES (?, {cid_sql}, ?)", (split, blob))
    return path


def test_stackoverflow_invalid_utf8_client_ids_are_not_merged(tmp_path):
    from tests.data.test_formats import _so_example
    db = _so_db(tmp_path / "so.sqlite", [
        ("train", "CAST(x'ff' AS TEXT)", _so_example("secret one .")),
        ("train", "CAST(x'fe' AS TEXT)", _so_example("secret two .")),
        ("train", "x'3031'", _so_example("a blob id is not a text id .")),
        ("train", "'00000001'", _so_example("a valid sentence ."))])
    corpus = load_stackoverflow_sqlite(db, progress=False, use_cache=False)
    assert list(corpus.client_ids) == ["00000001"] and corpus.stats.malformed == 3


def test_stackoverflow_file_that_is_not_sqlite(tmp_path):
    p = tmp_path / "so.sqlite"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(MalformedDataError, match=r"stackoverflow: cannot read .*so\.sqlite"):
        load_stackoverflow_sqlite(p, progress=False, use_cache=False)


def test_stackoverflow_without_examples_table(tmp_path):
    p = tmp_path / "other.sqlite"
    with sqlite3.connect(p) as con:
        con.execute("CREATE TABLE t (x)")
    with pytest.raises(MalformedDataError, match=r"no `examples` table.*not a TFF SQLite file"):
        load_stackoverflow_sqlite(p, progress=False, use_cache=False)


def test_chitchat_invalid_utf8_file_names_the_path(tmp_path):
    p = tmp_path / "dataset.json"
    p.write_bytes(b'{"c1": {"messages": [[{"sender": "\xff", "text": "hi"}]]}}')
    with pytest.raises(MalformedDataError, match=r"chitchat: .*dataset\.json is not valid UTF-8 JSON"):
        load_chitchat(path=p, progress=False)


def test_chitchat_surrogate_sender_is_malformed(tmp_path):
    p = tmp_path / "dataset.json"
    p.write_text(json.dumps({"c1": {"messages": [[{"sender": "\udc80", "text": "hi"},
                                                   {"sender": "ann", "text": "hello"}]]}}))
    corpus = load_chitchat(path=p, progress=False)
    assert list(corpus.client_ids) == ["ann"] and corpus.stats.malformed == 1


# --------------------------------------------------------------------------------------------
# Tokenizers: too-small vocabularies and corrupt files name the problem / the path
# --------------------------------------------------------------------------------------------

_TEXTS = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen jugs"] * 50


def test_sentencepiece_vocab_size_below_specials():
    with pytest.raises(TokenizerError, match=r"vocab_size=3 .*4 special tokens"):
        train_sentencepiece(_TEXTS, vocab_size=3, use_cache=False)


def test_sentencepiece_vocab_size_smaller_than_the_alphabet():
    with pytest.raises(TokenizerError, match=r"vocab_size=10 is too small for .*100 sentences.*"
                                             r"Vocabulary size is smaller than required_chars"):
        train_sentencepiece(_TEXTS, vocab_size=10, use_cache=False)


def test_corrupt_sentencepiece_model_file_names_the_path(tmp_path):
    p = tmp_path / "spm.model"
    p.write_bytes(b"\x00garbage, not a model proto")
    with pytest.raises(TokenizerError, match=r"spm\.model.* not a valid SentencePiece model"):
        SentencePieceTokenizer.load(p)


def test_corrupt_word_vocabulary_json_names_the_path(tmp_path):
    p = tmp_path / "vocab.json"
    p.write_text('{"type": "word", "words": ["a", ')
    with pytest.raises(TokenizerError, match=r"vocab\.json.* is not valid JSON"):
        load_tokenizer(p)


def test_word_vocabulary_of_the_wrong_shape_names_the_path(tmp_path):
    p = tmp_path / "vocab.json"
    p.write_text('["a", "b"]')
    with pytest.raises(TokenizerError, match=r"vocab\.json is not a fedpriv word vocabulary"):
        WordTokenizer.load(p)


def test_missing_tokenizer_file_names_the_path(tmp_path):
    with pytest.raises(MissingResourceError, match=r"SentencePiece model file '.*none\.model' not found"):
        load_tokenizer(tmp_path / "none.model")


def test_word_tokenizer_needs_a_positive_k():
    with pytest.raises(TokenizerError, match=r"k must be >= 1, got -1"):
        WordTokenizer.fit(_TEXTS, k=-1)


def test_corrupt_cached_sentencepiece_model_is_retrained(tmp_path):
    cache = tmp_path / "c"
    tok = train_sentencepiece(_TEXTS, vocab_size=40, cache_dir=cache)
    (model,) = (cache / "tokenizers").glob("*.model")
    model.write_bytes(b"corrupted on disk")
    again = train_sentencepiece(_TEXTS, vocab_size=40, cache_dir=cache)
    assert again.encode(_TEXTS[:2]) == tok.encode(_TEXTS[:2])
    assert model.read_bytes() == tok.model_proto  # the corrupt entry was replaced


# --------------------------------------------------------------------------------------------
# Configs and overrides (item 8)
# --------------------------------------------------------------------------------------------

LM = "configs/lm_fl.py"
FP = "configs/fred_pipeline.py"


@pytest.mark.parametrize("text", ["ture", "on", "y", "2"])
def test_bool_override_must_be_a_boolean(text):
    with pytest.raises(ConfigError, match=rf"override 'compare_all': expected a boolean "
                                          rf"\(true/false/1/0/yes/no\), got '{text}'"):
        common.load_config(f"{FP}:smoke,compare_all={text}")


@pytest.mark.parametrize("text, value", [("TRUE", True), ("no", False), ("1", True), ("0", False),
                                         ("Yes", True), ("false", False)])
def test_bool_override_accepts_exactly_six_words(text, value):
    assert common.load_config(f"{FP}:smoke,compare_all={text}").compare_all is value


@pytest.mark.parametrize("text", ["2.5", "1e3", "ten"])
def test_int_override_must_be_an_integer(text):
    with pytest.raises(ConfigError, match=rf"override 'rounds': expected an integer, got '{text}'"):
        common.load_config(f"{LM}:smoke,rounds={text}")


@pytest.mark.parametrize("spec, message", [
    pytest.param(f"{LM}:smoke,split=0.3/0.1/0.1", r"split must be fractions that sum to 1, got "
                 r"\(0\.3, 0\.1, 0\.1\) \(sum 0\.5\)", id="split_fractions_must_sum_to_one"),
    pytest.param(f"{LM}:smoke,rounds", r"override 'rounds' needs a value: rounds=\.\.\.",
                 id="override_without_value"),
    pytest.param(f"{LM}:smoke,rounds=None", r"override 'rounds': None is not allowed \(type int\)",
                 id="none_for_a_required_field"),
    pytest.param(f"{LM}:smoke,clip_norm=nan",
                 r"override 'clip_norm': expected a number, got 'nan'", id="nan_float_override"),
    pytest.param(f"{LM}:smoke,rounds=3,rounds=4", r"override 'rounds' is given twice",
                 id="override_given_twice"),
    pytest.param("README.md:smoke", r"config file 'README\.md' is not a Python file",
                 id="config_that_is_not_a_python_file"),
])
def test_bad_config_spec(spec, message):
    with pytest.raises(ConfigError, match=message):
        common.load_config(spec)


def test_missing_config_file():
    with pytest.raises(FileNotFoundError, match=r"config file 'configs/nope\.py' not found"):
        common.load_config("configs/nope.py:smoke")


@pytest.mark.parametrize("override, message", [
    ("vocab_size=3", r"vocab_size must be > 4 \(the 4 special tokens\), got 3"),
    ("corpus=reddit", r"corpus must be one of \('chitchat', 'shakespeare', 'simpsons'.*\), got 'reddit'"),
    ("algorithm=dpsgd", r"algorithm must be one of \('fedavg', 'dp_fedavg', 'dp_ftrl', 'dp_mf_banded', "
                        r"'dp_mf_blt', 'dp_fedavg_fixed', 'dp_ddg', 'dp_mf_banded_opt'\), got 'dpsgd'"),
    ("cohort_size=0", r"cohort_size must be >= 1, got 0"),
    ("delta=2", r"delta must be in \(0, 0\.001\], got 2\.0"),
    ("clip_norm=-1", r"clip_norm must be > 0, got -1\.0"),
    ("noise_cohort_size=4", r"noise_cohort_size \(4\) must be >= cohort_size \(8\)"),
    ("target_epsilon=None", r"dp_ftrl needs noise_multiplier or target_epsilon"),
])
def test_lm_config_values_are_validated(override, message):
    with pytest.raises(ConfigError, match=message):
        common.load_config(f"{LM}:smoke,{override}")


def test_config_types_are_checked_on_replace():
    cfg = common.load_config(f"{LM}:smoke")
    with pytest.raises(ConfigError, match=r"rounds must be an int, got 2\.5"):
        dataclasses.replace(cfg, rounds=2.5)


# --------------------------------------------------------------------------------------------
# Experiment entry points: exit 2, one line on stderr, workdir untouched (subprocesses)
# --------------------------------------------------------------------------------------------

def _run_entry(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module, spec, message", [
    ("experiments.lm_fl", "configs/lm_fl.py:smoke,rounds=2.5",
     "experiments.lm_fl: error: override 'rounds': expected an integer, got '2.5'"),
    ("experiments.demo", "README.md:smoke",
     "experiments.demo: error: config file 'README.md' is not a Python file"),
    ("experiments.fred_pipeline", "configs/fred_pipeline.py:smoke,compare_all=ture",
     "experiments.fred_pipeline: error: override 'compare_all': expected a boolean"),
    ("experiments.latency_figure", "configs/latency_figure.py:smoke,trials=0",
     "experiments.latency_figure: error: trials must be >= 1, got 0"),
    ("experiments.public_training", "configs/public_training.py:smoke,teacher_path=/no/teacher.gguf",
     "experiments.public_training: error: FileNotFoundError: teacher GGUF '/no/teacher.gguf' does "
     "not exist"),
])
def test_experiment_user_error_exits_2_with_one_line(tmp_path, module, spec, message):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "metrics.jsonl").write_text('{"round": 1}\n')
    r = _run_entry(module, "--config", spec, "--workdir", str(wd))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in wd.iterdir()) == ["metrics.jsonl"]
    assert (wd / "metrics.jsonl").read_text() == '{"round": 1}\n'


def test_cli_wrapper_keeps_bugs_as_tracebacks():
    def buggy(argv):
        raise ZeroDivisionError("a genuine bug")
    with pytest.raises(ZeroDivisionError):
        common.cli(buggy, [])


def test_cli_wrapper_turns_user_errors_into_exit_2(capsys):
    def bad(argv):
        raise ConfigError("override 'x': expected an integer,\n got 'y'")
    with pytest.raises(SystemExit) as e:
        common.cli(bad, [])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: override 'x': expected an integer, got 'y'" in err


@pytest.mark.parametrize("module, argv, message", [
    ("privacy_utility", ["--seeds", "0,x"], "unrecognized arguments: --seeds 0,x"),
    ("latency_figure", ["--trials", "40"], "unrecognized arguments: --trials 40"),  # config fields now
    ("fred_table", ["--delta", "2"], "unrecognized arguments: --delta 2"),
])
def test_bad_command_line_argument_is_one_line(capsys, module, argv, message):
    import importlib
    main = importlib.import_module(f"experiments.{module}").main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("spec, message", [
    ("smoke,seeds=0/x", "seeds"), ("smoke,tokenizers=bpe", "tokenizers = ('bpe',): invalid"),
    ("smoke,epsilons=", "epsilons"), ("smoke,lm=1", "not 'lm'"), ("big", "unknown scale 'big'")])
def test_privacy_utility_config_errors_exit_2(capsys, spec, message):
    from experiments import privacy_utility
    with pytest.raises(SystemExit) as e:
        common.cli(privacy_utility.main, ["--config", f"configs/privacy_utility.py:{spec}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("spec, message", [
    ("smoke,delta=2", "delta must be in (0, 0.001], got 2.0"),
    ("smoke,seeds=0", "seeds must be >= 1, got 0"),
    ("smoke,pca_dims=x", "override 'pca_dims': expected an integer, got 'x'"),
    ("huge", "unknown scale 'huge'"),
])
def test_fred_table_config_error_is_one_line(tmp_path, capsys, spec, message):
    from experiments import fred_table
    wd = tmp_path / "wd"
    with pytest.raises(SystemExit) as e:
        common.cli(fred_table.main, ["--config", f"configs/fred_table.py:{spec}", "--workdir", str(wd)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("experiments.fred_table: error: ") and message in err, err
    assert not wd.exists()  # refused before anything is written


# --------------------------------------------------------------------------------------------
# clip_update (item 7): non-positive / NaN clip norms fail closed, also under jit
# --------------------------------------------------------------------------------------------

_U = {"w": jnp.array([3.0, 4.0]), "b": jnp.array([[12.0]])}   # global norm 13


@pytest.mark.parametrize("c", [-1.0, 0.0, float("nan"), -float("inf")])
def test_clip_update_refuses_bad_concrete_clip_norm(c):
    with pytest.raises(FedprivError, match=r"clip_norm must be a positive number .*got "):
        clip_update(_U, c)
    with pytest.raises(ValueError, match=r"clip_norm"):
        clip_update(_U, jnp.float32(c))


@pytest.mark.parametrize("c", [-1.0, 0.0, float("nan")])
def test_clip_update_traced_bad_clip_norm_zeroes_and_flags(c):
    clipped, norm, finite = jax.jit(clip_update)(_U, jnp.float32(c))
    assert not bool(finite)
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree_util.tree_leaves(clipped))
    assert float(norm) == pytest.approx(13.0)


def test_clip_update_traced_valid_clip_norm_still_clips():
    clipped, norm, finite = jax.jit(clip_update)(_U, jnp.float32(1.3))
    total = np.sqrt(sum(float(jnp.sum(x ** 2)) for x in jax.tree_util.tree_leaves(clipped)))
    assert bool(finite) and total == pytest.approx(1.3, rel=1e-5) and float(norm) == pytest.approx(13.0)
    # the direction is kept: clipped = u * 0.1
    np.testing.assert_allclose(clipped["w"], np.array([0.3, 0.4]), rtol=1e-5)


def test_clip_update_vmapped_over_clip_norms():
    cs = jnp.array([26.0, -1.0, jnp.nan, 1.3])
    clipped, _, finite = jax.vmap(clip_update, in_axes=(None, 0))(_U, cs)
    assert finite.tolist() == [True, False, False, True]
    np.testing.assert_allclose(clipped["w"][:, 0], [3.0, 0.0, 0.0, 0.3], rtol=1e-5)


# --------------------------------------------------------------------------------------------
# build_cohort and samplers
# --------------------------------------------------------------------------------------------

def _ds():
    return {"a": {"x": np.zeros((4, 3), np.int32)}, "b": {"x": np.zeros((2, 3), np.int32)},
            "empty": {"x": np.zeros((0, 3), np.int32)},
            "odd": {"x": np.zeros((3, 3), np.int32), "y": np.zeros((2,), np.int32)}}


@pytest.mark.parametrize("ids, kw, message", [
    (["a", "empty"], {}, r"client 'empty' has no examples"),
    (["odd"], {}, r"client 'odd': fields have different numbers of examples"),
    (["a", "b"], dict(capacity=1), r"cohort of 2 clients exceeds capacity 1"),
    (["a"], dict(batch_size=0), r"batch_size must be >= 1, got 0"),
    ([], {}, r"empty cohort"),
])
def test_build_cohort_refuses(ids, kw, message):
    args = dict(batch_size=2, capacity=4) | kw
    with pytest.raises(ValueError, match=message):
        build_cohort(_ds(), ids, **args)


@pytest.mark.parametrize("make, message", [
    (lambda: UniformSampler(3, 5), r"cohort size 5 must be in \[1, population=3\]"),
    (lambda: UniformSampler(0, 1), r"the population is empty \(num_clients=0\)"),
    (lambda: PoissonSampler(10, 0.0), r"sampling rate must be in \(0, 1\], got 0\.0"),
    (lambda: PoissonSampler(10, 1.5), r"sampling rate must be in \(0, 1\], got 1\.5"),
    (lambda: ShuffledPassSampler(4, 0), r"cohort size 0 must be in \[1, population=4\]"),
])
def test_samplers_refuse_bad_sizes_and_rates(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --------------------------------------------------------------------------------------------
# Issue 24: silent-wrong settings, resource limits and messages that name the input
# (configs, the `fedpriv` CLIs, the DP API). Every case: the refusal and its one-line message.
# --------------------------------------------------------------------------------------------

_SILENT_WRONG_AND_LIMITS = [
    # (1) exclusive DP fields: both yours, or yours against a scale's
    (f"{LM}:smoke,noise_multiplier=0.05,target_epsilon=1",
     r"noise_multiplier and target_epsilon are both set \(noise_multiplier=0\.05 \(your override\), "
     r"target_epsilon=1\.0 \(your override\)\): they are exclusive; set only one of them"),
    (f"{LM}:smoke,noise_multiplier=0.05",
     r"target_epsilon=50\.0 \(from scale 'smoke'\)\): they are exclusive; add target_epsilon=None"),
    (f"{LM}:paper,target_epsilon=2", r"noise_multiplier=8\.8\d* \(from scale 'paper'\).*add noise_multiplier=None"),
    ("configs/lm_sweep.py:smoke,noise_multiplier=3", r"add target_epsilon=None to use noise_multiplier"),
    ("configs/mf_comparison.py:smoke,noise_multiplier=3", r"noise_multiplier and target_epsilon are both set"),
    # (2) DP settings beside a non-private algorithm
    (f"{LM}:smoke,algorithm=fedavg,target_epsilon=1",
     r"target_epsilon is a DP setting but algorithm=fedavg is non-private"),
    (f"{LM}:smoke,algorithm=fedavg,target_epsilon=None,noise_multiplier=1",
     r"noise_multiplier is a DP setting but algorithm=fedavg is non-private"),
    (f"{LM}:smoke,algorithm=fedavg,delta=1e-5", r"delta is a DP setting but algorithm=fedavg"),
    (f"{LM}:smoke,algorithm=fedavg,noise_cohort_size=100",
     r"noise_cohort_size is a DP setting but algorithm=fedavg"),
    (f"{LM}:smoke,delta=1e-5,target_epsilon=2,algorithm=fedavg",
     r"target_epsilon, delta are DP settings but algorithm=fedavg is non-private"),
    ("configs/fred_mixtures.py:smoke,algorithm=fedavg",
     r"total_epsilon is a DP setting but algorithm=fedavg is non-private"),
    ("configs/public_training.py:smoke,algorithm=fedavg",
     r"epsilons=18\.71 is a DP setting but algorithm=fedavg is non-private"),
    # fields an experiment sets itself: an override would be dropped silently
    ("configs/fred_pipeline.py:smoke,target_epsilon=3", r"target_epsilon cannot be overridden here: "
     r"the FL stage's noise is calibrated to what FreD left of total_epsilon"),
    ("configs/fred_pipeline.py:smoke,noise_multiplier=3", r"noise_multiplier cannot be overridden here"),
    ("configs/fred_mixtures.py:smoke,noise_multiplier=3", r"noise_multiplier cannot be overridden here"),
    ("configs/fred_mixtures.py:smoke,target_epsilon=3", r"target_epsilon cannot be overridden here"),
    ("configs/privacy_utility.py:smoke,target_epsilon=3", r"target_epsilon cannot be overridden here: "
     r"each row sets it"),
    ("configs/privacy_utility.py:smoke,algorithm=fedavg", r"algorithm cannot be overridden here"),
    ("configs/privacy_utility.py:smoke,noise_multiplier=1", r"noise_multiplier cannot be overridden here"),
    ("configs/mf_comparison.py:smoke,algorithm=dp_fedavg", r"algorithm cannot be overridden here: "
     r"each row sets it: set algorithms="),
    ("configs/ddg_comparison.py:smoke,ddg_bits=12", r"ddg_bits cannot be overridden here: .*set bits="),
    ("configs/ddg_comparison.py:smoke,algorithm=dp_ftrl", r"algorithm cannot be overridden here"),
    ("configs/public_training.py:smoke,target_epsilon=3", r"target_epsilon cannot be overridden here: "
     r"each run sets it from epsilons"),
    ("configs/public_training.py:smoke,noise_multiplier=1", r"noise_multiplier cannot be overridden here"),
    ("configs/wang_ablations.py:smoke,target_epsilon=3", r"target_epsilon cannot be overridden here"),
    # resource limits (stated maxima, checked before any data is loaded)
    (f"{LM}:smoke,seed=99999999999999999999",
     r"seed = 99999999999999999999 exceeds its limit 4,294,967,295 \(PRNG seeds\)"),
    (f"{LM}:smoke,seed=-1", r"seed must be in \[0, 4,294,967,295\], got -1"),
    (f"{LM}:smoke,seq_len=1000000", r"seq_len = 1000000 exceeds its limit 4,096"),
    (f"{LM}:smoke,vocab_size=10000000", r"vocab_size = 10000000 exceeds its limit 262,144"),
    (f"{LM}:smoke,rounds=10000000", r"rounds = 10000000 exceeds its limit 1,000,000"),
    (f"{LM}:smoke,hidden_dim=100000", r"hidden_dim = 100000 exceeds its limit 16,384"),
    (f"{LM}:smoke,embed_dim=100000", r"embed_dim = 100000 exceeds its limit 16,384"),
    (f"{LM}:smoke,num_heads=100000", r"num_heads = 100000 exceeds its limit 1,024"),
    (f"{LM}:smoke,batch_size=10000000", r"batch_size = 10000000 exceeds its limit 65,536"),
    (f"{LM}:smoke,eval_batch_size=10000000", r"eval_batch_size = 10000000 exceeds its limit 65,536"),
    (f"{LM}:smoke,max_examples_per_client=100000000",
     r"max_examples_per_client = 100000000 exceeds its limit 1,000,000"),
    ("configs/public_training.py:smoke,seq_len=100000", r"seq_len = 100000 exceeds its limit 4,096"),
    ("configs/public_training.py:smoke,seeds=0/99999999999", r"seeds = 99999999999 exceeds its limit"),
    ("configs/population_expansion.py:smoke,seeds=0/99999999999", r"seeds = 99999999999 exceeds its limit"),
    ("configs/privacy_utility.py:smoke,seq_len=100000", r"seq_len = 100000 exceeds its limit 4,096"),
    # values whose old errors did not name the input
    (f"{LM}:smoke,split=0.8/0.2", r"split must have 3 parts, train/validation/test \(e\.g\. "
     r"0\.8/0\.1/0\.1\), got 2: \(0\.8, 0\.2\)"),
    (f"{LM}:smoke,split=0.5/0.2/0.2/0.1", r"split must have 3 parts.*got 4"),
    ("configs/population_expansion.py:smoke,split=0.5/0.5", r"split must have 3 parts"),
    ("configs/wang_figure3.py:smoke,split=0.5/0.5", r"split must have 3 parts"),
    ("configs/public_training.py:smoke,split=1.0", r"split must have 3 parts"),
    (f"{LM}:smoke,target_epsilon=None,noise_multiplier=inf", r"noise_multiplier must be finite, got inf"),
    (f"{LM}:smoke,target_epsilon=inf", r"target_epsilon must be finite, got inf"),
    (f"{LM}:smoke,delta=inf", r"delta must be finite, got inf"),
    (f"{LM}:smoke,client_lr=inf", r"client_lr must be finite, got inf"),
    (f"{LM}:smoke,server_lr=-inf", r"server_lr must be finite, got -inf"),
    ("configs/fred_pipeline.py:smoke,total_epsilon=inf", r"total_epsilon must be finite, got inf"),
    ("configs/fred_table.py:smoke,epsilon=inf", r"epsilon must be finite, got inf"),
    (f"{LM}:rounds=3", r"the spec starts with a scale name, not 'rounds=3' \(scale\[,field=value,\.\.\.\]"),
    (f"{LM}:smoke,=3", r"unknown config field ''"),
]


@pytest.mark.parametrize("spec, message", _SILENT_WRONG_AND_LIMITS)
def test_config_conflicts_and_limits_are_refused(spec, message):
    with pytest.raises(ConfigError, match=message) as err:
        common.load_config(spec)
    assert "\n" not in str(err.value)


def test_a_scale_value_cleared_explicitly_is_accepted_in_any_order():
    """The documented rule (configs/common.py): a scale's target_epsilon is cleared by the user
    explicitly; all overrides are applied together, so their order does not matter."""
    for spec in ("smoke,target_epsilon=None,noise_multiplier=0.05",
                 "smoke,noise_multiplier=0.05,target_epsilon=None"):
        cfg = common.load_config(f"{LM}:{spec}")
        assert cfg.noise_multiplier == 0.05 and cfg.target_epsilon is None
    # a scale's DP defaults are not the user's request: plain FedAvg at smoke is fine
    assert common.load_config(f"{LM}:smoke,algorithm=fedavg").algorithm == "fedavg"


def _api_cases():
    from fedpriv.dp import accounting as acc, ddg, matrix, noise
    key = jax.random.key(0)
    dpa = pytest.importorskip("dp_accounting")
    big = acc.dp_fedavg_poisson_event(1.0, 0.5, 10_000)  # RDP epsilon ~2e3: beyond PLD's limit
    return [
        # (5) int-valued privacy parameters are never truncated
        (lambda: noise.tree_privatizer(1.0, key, restart_every=2.7),
         r"restart_every must be an integer >= 1, got 2\.7"),
        (lambda: noise.tree_privatizer(1.0, key, restart_every=True),
         r"restart_every must be an integer >= 1, got True"),
        (lambda: noise.tree_privatizer(1.0, key, restart_every=0), r"restart_every must be an integer >= 1, got 0"),
        (lambda: noise.tree_privatizer(1.0, key, restart_every="4"), r"restart_every must be an integer >= 1, got '4'"),
        (lambda: noise.tree_privatizer(1.0, None, 2.5), r"restart_every must be an integer >= 1, got 2\.5"),
        (lambda: noise.tree_privatizer(math.inf, None, 3), r"noise std must be a finite number >= 0, got inf"),
        (lambda: noise.gaussian_privatizer(float("nan"), key), r"noise std must be a finite number >= 0, got nan"),
        (lambda: ddg.DDGConfig(dim=10, num_clients=5, clip=1.0, noise_multiplier=1.0, bits=12.5),
         r"bits must be an integer >= 2, got 12\.5"),
        (lambda: ddg.DDGConfig(dim=10.5, num_clients=5, clip=1.0, noise_multiplier=1.0, bits=16),
         r"dim must be an integer >= 1, got 10\.5"),
        (lambda: ddg.DDGConfig(dim=10, num_clients=True, clip=1.0, noise_multiplier=1.0, bits=16),
         r"num_clients must be an integer >= 1, got True"),
        (lambda: matrix.max_participations(10, 2, cap=2.5), r"max_part must be an integer >= 1, got 2\.5"),
        (lambda: matrix.tree_prefix_variance(10, 2.5), r"restart_every must be an integer >= 1, got 2\.5"),
        (lambda: matrix.matrix_event(matrix.banded_strategy(2), 1.0, 2.5, 1),
         r"rounds must be an integer >= 1, got 2\.5"),
        (lambda: matrix.banded_strategy(2.5), r"bands must be an integer >= 1"),
        (lambda: acc.dp_ftrl_event(1.0, 10, rounds_per_epoch=2.5),
         r"rounds_per_epoch must be an integer >= 1, got 2\.5"),
        (lambda: acc.dp_ftrl_event(1.0, 10.5), r"rounds must be an integer >= 1, got 10\.5"),
        (lambda: acc.dp_ftrl_event(1.0, float("nan")), r"rounds must be an integer >= 1, got nan"),
        (lambda: acc.dp_ftrl_event(1.0, "10"), r"rounds must be an integer >= 1, got '10'"),
        (lambda: acc.dp_ftrl_event(1.0, 10**7), r"rounds must be <= 1,000,000"),
        (lambda: acc.dp_ftrl_event(1e300, 10), r"noise multiplier must be a number in \[0, 1e\+06\], got 1e\+300"),
        (lambda: acc.dp_ftrl_event(True, 10), r"noise multiplier must be a number in \[0, 1e\+06\], got True"),
        (lambda: acc.dp_ftrl_event(float("nan"), 10), r"noise multiplier must be a number .* got nan"),
        (lambda: acc.dp_fedavg_poisson_event(1.0, True, 10), r"sampling rate must be in \(0, 1\], got True"),
        (lambda: acc.dp_fedavg_poisson_event(1.0, float("nan"), 10), r"sampling rate must be in \(0, 1\], got nan"),
        (lambda: acc.compute_epsilon(dpa.GaussianDpEvent(1.0), True), r"delta must be in \(0, 0\.001\], got True"),
        (lambda: acc.compute_epsilon(dpa.GaussianDpEvent(1.0), 1e-6, accountant="moments"),
         r"accountant must be rdp, pld or best, got 'moments'"),
        (lambda: acc.compute_epsilon(dpa.GaussianDpEvent(1.0), 1e-6, neighboring="swap"),
         r"neighboring must be one of"),
        (lambda: acc.compute_epsilon(big, 1e-6, accountant="pld"),
         r"the PLD accountant is limited to epsilon <= 1000 \(RDP gives"),
        (lambda: acc.calibrate_noise_multiplier(lambda z: acc.dp_ftrl_event(z, 10), math.inf, 1e-6),
         r"epsilon must be a finite number > 0, got inf"),
        (lambda: acc.calibrate_noise_multiplier(lambda z: acc.dp_ftrl_event(z, 10), 0.0, 1e-6),
         r"epsilon must be a finite number > 0, got 0\.0"),
        (lambda: acc.calibrate_noise_multiplier(lambda z: acc.dp_ftrl_event(z, 10), True, 1e-6),
         r"epsilon must be a finite number > 0, got True"),
    ]


@pytest.mark.parametrize("case", range(31))
def test_dp_api_refuses_with_a_message_naming_the_input(case):
    make, message = _api_cases()[case]
    with pytest.raises(ValueError, match=message):
        make()


def test_dp_api_case_count():
    assert len(_api_cases()) == 31  # keep the parametrization above in step


def test_integral_floats_are_still_accepted():
    """``4.0`` rounds per tree is 4 (a config's float from arithmetic), never truncated."""
    import jax
    import jax.numpy as jnp

    from fedpriv.dp import noise
    x = jnp.zeros((3,))
    outs = []
    for r in (4.0, 4, 5):  # 4.0 restarts like 4 (its 5th release opens tree 1), unlike 5
        tx = noise.tree_privatizer(1.0, jax.random.key(0), r)
        state, out = tx.init(x), []
        for _ in range(5):
            y, state = tx.update(x, state)
            out.append(np.asarray(y))
        outs.append(np.stack(out))
    assert np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[0][4], outs[2][4])
    assert noise.check_int("x", np.int64(3)) == 3


# --------------------------------------------------------------------------------------------
# Issue 54 item 3: the audit's tracebacks, unclear messages and questionable results, each one
# line naming the input, refused before any training.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("module, spec, message", [
    ("lm_fl", "configs/fred_pipeline.py:smoke", r"--config 'configs/fred_pipeline\.py:smoke' gives a config of type "
     r"FredPipelineConfig \(configs/fred_pipeline\.py\), but experiments\.lm_fl takes LMFLConfig: use --config "
     r"configs/lm_fl\.py:<scale>"),
    ("fred_pipeline", "configs/lm_fl.py:smoke", r"gives a config of type LMFLConfig \(configs/lm_fl\.py\), but "
     r"experiments\.fred_pipeline takes FredPipelineConfig"),
    ("lm_sweep", "configs/population_expansion.py:smoke", r"experiments\.lm_sweep takes LMSweepConfig"),
    ("population_expansion", "configs/iw_regime.py:smoke", r"experiments\.population_expansion takes "
     r"PopulationExpansionConfig"),
    ("latency_figure", "configs/demo.py:smoke", r"gives a config of type LMFLConfig"),
])
def test_a_config_of_another_experiment_is_refused_by_type(tmp_path, capsys, module, spec, message):
    import importlib
    import re
    main = importlib.import_module(f"experiments.{module}").main
    wd = tmp_path / "wd"
    with pytest.raises(SystemExit) as e:
        common.cli(main, ["--config", spec, "--workdir", str(wd)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"experiments.{module}: error: ") and re.search(message, err), err
    assert not wd.exists()  # refused before the workdir is taken


def test_every_experiment_names_the_config_type_it_takes():
    """The check lives in the shared entry point (``config_and_workdir``): every experiment's
    ``configs/<name>.py`` declares the type its ``get_config`` returns; demo shares lm_fl's."""
    import configs.lm_fl
    names = [p.stem for p in (REPO / "experiments").glob("*.py") if p.stem != "common"
             and ("config_and_workdir(argv" in p.read_text() or "printing_main(run" in p.read_text())]
    assert len(names) >= 15
    for n in names:
        assert isinstance(common.expected_config_type(n), type), n
    assert common.expected_config_type("demo") is configs.lm_fl.LMFLConfig
    common.check_config_type(common.load_config("configs/demo.py:smoke"), "lm_fl", "configs/demo.py:smoke")


_ISSUE54_CONFIGS = [
    ("configs/population_expansion.py:smoke,accountant=pld",
     r"accountant=pld cannot account the runs executed here: they train cohorts of train_cohort=4 with the noise "
     r"of noise_cohort=20 \(multiplier z \* 4/20\) and PLD covers Gaussian multipliers >= 0\.3 only"),
    ("configs/population_expansion.py:smoke,split=0.6/0.4/0",
     r"split: train, validation and test must each be > 0 \(each part needs clients\), got 0\.6/0\.4/0"),
    (f"{LM}:smoke,split=1/0/0", r"split: train, validation and test must each be > 0.*got 1/0/0"),
    ("configs/wang_figure3.py:smoke,split=0.5/0.5/0", r"split: train, validation and test must each be > 0"),
    ("configs/latency_figure.py:smoke,oversample=inf", r"oversample must be finite, got inf"),
    ("configs/latency_figure.py:smoke,oversample=2", r"oversample \* figure_p must be < 1, got 2 \* 0\.5"),
    ("configs/latency_figure.py:smoke,figure_p=1", r"oversample \* figure_p must be < 1, got 1\.1 \* 1"),
    (f"{LM}:smoke,delta=0.999999", r"delta must be in \(0, 0\.001\], got 0\.999999 \(a guarantee that fails "
     r"with probability delta"),
    (f"{LM}:smoke,delta=0", r"delta must be in \(0, 0\.001\], got 0\.0"),
    ("configs/fred_mixtures.py:smoke,fred_delta=0.1", r"fred_delta must be in \(0, 0\.001\], got 0\.1"),
    ("configs/fred_table.py:smoke,delta=0.01", r"delta must be in \(0, 0\.001\]"),
    ("configs/fred_pipeline.py:smoke,total_epsilon=0.5",
     r"total_epsilon=0\.5 leaves nothing for FL-finetuning: FreD's release alone costs epsilon 0\.87"),
    ("configs/fred_mixtures.py:smoke,fred_unit=user,total_epsilon=0.9",
     r"total_epsilon=0\.9 leaves nothing for FL-finetuning"),
    ("configs/fred_mixtures.py:smoke,fred_unit=client", r"fred_unit must be one of .*sample.*user.*got 'client'"),
    ("configs/fred_mixtures.py:small,num_sentences=19783", r"num_sentences=19,783 but the packaged wikipedia pool "
     r"has 19,782 sentences"),
    ("configs/wang_figure3.py:smoke,num_heads=0,arch=transformer", r"num_heads must be >= 1, got 0"),
    ("configs/wang_figure3.py:smoke,num_heads=-1", r"num_heads must be >= 1, got -1"),
    # the parser-level number rules (every config, every field, tuple elements too)
    ("configs/public_training.py:smoke,match_betas=-1", r"match_betas must be >= 0, got -1\.0"),
    ("configs/lm_sweep.py:smoke,clip_norms=inf", r"clip_norms must be finite, got inf"),
    ("configs/fred_table.py:smoke,clip=inf", r"clip must be finite, got inf"),
    ("configs/pre_text.py:smoke,temperature=inf", r"temperature must be finite, got inf"),
    ("configs/population_expansion.py:smoke,weight_max=1e400", r"weight_max must be finite, got inf"),
    ("configs/public_training.py:smoke,kd_beta=inf", r"kd_beta must be finite, got inf"),
    ("configs/fred_mixtures.py:smoke,prefinetune_batch=99999999999", r"prefinetune_batch = 99999999999 exceeds "
     r"its limit 65,536 \(examples per step held in memory\)"),
    ("configs/wang_figure3.py:smoke,oracle_steps=99999999999", r"oracle_steps = 99999999999 exceeds its limit"),
    ("configs/latency_figure.py:smoke,trials=99999999999", r"trials = 99999999999 exceeds its limit"),
    ("configs/pre_text.py:smoke,max_new=99999999999", r"max_new = 99999999999 exceeds its limit 4,096"),
    ("configs/pre_text.py:smoke,pe_rounds=99999999999", r"pe_rounds = 99999999999 exceeds its limit"),
    ("configs/fred_table.py:smoke,epsilon=1e300", r"epsilon = 1e\+300 exceeds its limit 1,000,000 \(an epsilon "
     r"this large is no privacy guarantee\)"),  # was "The function value at x=0.1 is NaN" (analytic Gaussian)
    ("configs/population_expansion.py:smoke,vocab_words=99999999999", r"vocab_words = 99999999999 exceeds"),
    (f"{LM}:smoke,ddg_bits=99999999999", r"ddg_bits = 99999999999 exceeds its limit 31"),
]


@pytest.mark.parametrize("spec, message", _ISSUE54_CONFIGS)
def test_issue54_config_refusals(spec, message):
    with pytest.raises(ConfigError, match=message) as err:
        common.load_config(spec)
    assert "\n" not in str(err.value)


def test_every_numeric_field_of_every_config_refuses_nan_inf_and_negatives():
    """The probe of the audit, as a property: ``nan``, ``inf`` and ``-1`` given to any numeric
    field (scalar or tuple) of any config, at its smoke scale, is a one-line ``ConfigError``
    naming the field, never another exception and never accepted (no field takes them)."""
    import importlib

    from configs import common as cc
    cases = 0
    for path in sorted((REPO / "configs").glob("*.py")):
        if path.stem in ("__init__", "common"):
            continue
        module = importlib.import_module(f"configs.{path.stem}")
        base = module.get_config("smoke")
        for obj in (base, getattr(base, "lm", None)):
            if not dataclasses.is_dataclass(obj):
                continue
            for f in dataclasses.fields(obj):
                v, kinds = getattr(obj, f.name), cc._kinds(f.type)
                elem = (cc._tuple_element(f.type) or (type(v[0]).__name__ if v else None)
                        if "tuple" in kinds or isinstance(v, tuple) else cc._kind_of(kinds, v))
                if elem not in ("int", "float"):
                    continue
                for text in ("nan", "inf", "-1"):
                    cases += 1
                    with pytest.raises(ConfigError) as err:
                        module.get_config(f"smoke,{f.name}={text}")
                    assert f.name in str(err.value) and "\n" not in str(err.value), (path.stem, f.name, text)
    assert cases > 1000


def test_ddg_bits_31_decodes_without_overflow():
    """``ddg_comparison:smoke,bits=31`` ran into an XLA OverflowError (2^31 in int32)."""
    from fedpriv.dp import ddg
    for bits in (8, 31):
        cfg = ddg.DDGConfig(dim=4, num_clients=3, clip=1.0, noise_multiplier=1.0, bits=bits)
        m = cfg.modulus
        x = jnp.array([0, m // 2 - 1, m // 2, m - 1], dtype=jnp.uint32)
        for f in (ddg.centred, jax.jit(ddg.centred, static_argnums=0)):
            assert np.asarray(f(cfg, x)).tolist() == [0, m // 2 - 1, -(m // 2), -1]


# ----------------------------------------------------------------------------- the cache
@pytest.fixture
def _fresh_cache_warnings(monkeypatch):
    from fedpriv.data import cache
    monkeypatch.setattr(cache, "_WARNED", set())


def _tiny_jsonl(tmp_path):
    return _jsonl(tmp_path / "t.jsonl", [b'{"user": "a", "text": "hello there"}',
                                         b'{"user": "b", "text": "general kenobi"}'])


def test_a_cache_that_is_a_regular_file_is_bypassed_with_one_warning(tmp_path, monkeypatch, caplog,
                                                                     _fresh_cache_warnings):
    (tmp_path / "cachefile").write_text("not a directory")
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cachefile"))
    src = _tiny_jsonl(tmp_path)
    with caplog.at_level("WARNING", logger="fedpriv.data"):
        for _ in range(2):
            corpus = load_jsonl(src, progress=False)
            assert list(corpus.client_ids) == ["a", "b"] and corpus.stats.cache_path is None
        train_sentencepiece(_TEXTS, vocab_size=40)
    warnings = [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "cachefile (it is a file, not a directory): bypassed, nothing is cached; set FEDPRIV_CACHE" \
        in warnings[0]
    assert (tmp_path / "cachefile").read_text() == "not a directory"  # nothing lost


@pytest.mark.parametrize("errno_, reason", [(28, "No space left on device"), (30, "Read-only file system")])
def test_a_full_or_read_only_cache_is_bypassed(tmp_path, monkeypatch, caplog, _fresh_cache_warnings,
                                               errno_, reason):
    from fedpriv.data import cache

    def refuse(src, dst):
        raise OSError(errno_, reason, str(dst))
    monkeypatch.setattr(cache.os, "replace", refuse)
    with caplog.at_level("WARNING", logger="fedpriv.data"):
        corpus = load_jsonl(_tiny_jsonl(tmp_path), progress=False)
        train_sentencepiece(_TEXTS, vocab_size=40)
    assert list(corpus.client_ids) == ["a", "b"] and corpus.stats.cache_path is None
    msgs = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert msgs and all(f"({reason}): bypassed" in m for m in msgs), msgs
    assert not list((tmp_path / "cache").rglob("*.tmp"))  # no temporary file left behind


def test_an_lzma_corpus_that_cannot_be_decompressed_into_the_cache_is_one_line(tmp_path, monkeypatch,
                                                                               _fresh_cache_warnings):
    import lzma

    from fedpriv.data.errors import CacheError
    from tests.data.test_formats import _so_example
    db = _so_db(tmp_path / "so.sqlite", [("train", "'00000001'", _so_example("a valid sentence ."))])
    packed = tmp_path / "so.sqlite.lzma"
    packed.write_bytes(lzma.compress(db.read_bytes()))
    (tmp_path / "cachefile").write_text("x")
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cachefile"))
    with pytest.raises(CacheError, match=r"cannot write the decompressed copy of .*so\.sqlite\.lzma to the cache "
                                         r".*cachefile/sqlite .*set FEDPRIV_CACHE to a writable directory"):
        load_stackoverflow_sqlite(packed, progress=False, use_cache=False)


# ----------------------------------------------------------------------------- loaders
def test_a_directory_given_as_a_file_and_a_file_as_a_directory_are_named(tmp_path):
    from fedpriv.data.errors import PathKindError
    f = _tiny_jsonl(tmp_path)
    for call, message in [
            (lambda: load_jsonl(tmp_path, progress=False), r"JSONL file '.*' is a directory, not a file"),
            (lambda: load_text_dir(f, progress=False), r"text directory '.*t\.jsonl' is a file, not a directory"),
            (lambda: load_stackoverflow_sqlite(tmp_path, progress=False), r"StackOverflow SQLite file .* is a "
                                                                          r"directory"),
            (lambda: load_tokenizer(tmp_path), r"is a directory, not a file")]:
        with pytest.raises(PathKindError, match=message):
            call()
    with pytest.raises(MissingResourceError, match=r"text directory '.*nope' not found"):
        load_text_dir(tmp_path / "nope", progress=False)


@pytest.mark.parametrize("cap", [-1, 0, 2.5, True])
def test_max_examples_per_client_names_the_parameter(tmp_path, cap):
    from fedpriv.data import FederatedDataset
    message = rf"max_examples_per_client must be None \(no cap\) or an integer >= 1, got {cap!r}"
    with pytest.raises(ConfigError, match=message):
        load_jsonl(_tiny_jsonl(tmp_path), progress=False, max_examples_per_client=cap)
    corpus = load_jsonl(_tiny_jsonl(tmp_path), progress=False)
    with pytest.raises(ConfigError, match=message):
        corpus.cap(cap)
    ds = FederatedDataset.from_clients({"a": {"x": np.zeros((3, 2), np.int32)}})
    with pytest.raises(ConfigError, match=message):
        ds.cap(cap)


def test_a_unicode_line_separator_inside_a_line_keeps_one_example(tmp_path):
    """str.splitlines splits on U+2028, U+2029, U+0085, form feeds ...: a line-oriented loader
    must end lines at newline only (two examples from one line would change the user's data)."""
    (tmp_path / "alice.txt").write_bytes("one\u2028line\u2029with\x85every\x0cseparator\x1c\nnext\r\nlast\n"
                                         .encode("utf-8"))
    corpus = load_text_dir(tmp_path, progress=False, use_cache=False)
    assert corpus.texts() == ["one line with every separator", "next", "last"]
    assert corpus.stats.records == 3


# ----------------------------------------------------------------------------- the DP API
def test_tree_privatizer_refuses_an_int_where_a_key_is_expected():
    from fedpriv.dp import matrix, noise
    for make in (lambda k: noise.tree_privatizer(1.0, k, 4), lambda k: noise.gaussian_privatizer(1.0, k),
                 lambda k: matrix.banded_privatizer(1.0, k, 2)):
        with pytest.raises(ValueError, match=r"key must be a JAX PRNG key \(e\.g\. jax\.random\.key\(0\)\), got int 0"):
            make(0)
        with pytest.raises(ValueError, match=r"got an array of dtype float32 and shape \(3,\)"):
            make(jnp.zeros(3))
        with pytest.raises(ValueError, match=r"got an array of dtype key<fry> and shape \(2,\)"):
            make(jax.random.split(jax.random.key(0)))
        for key in (jax.random.key(0), jax.random.PRNGKey(0), None):  # typed, legacy raw, update-only
            make(key)


def test_accounting_refuses_nan_and_non_numeric_event_parameters():
    """``GaussianDpEvent(nan)`` was epsilon 0 under RDP and "cannot convert float NaN to integer"
    under PLD; a tree event with a NaN multiplier was accepted by the ledger."""
    import dp_accounting as dpa

    from fedpriv.dp import accounting as acc
    from fedpriv.dp.ledger import PrivacyLedger
    cases = [(dpa.GaussianDpEvent(math.nan), r"GaussianDpEvent\.noise_multiplier must be a number, got nan"),
             (dpa.SingleEpochTreeAggregationDpEvent(math.nan, 10),
              r"SingleEpochTreeAggregationDpEvent\.noise_multiplier must be a number, got nan"),
             (dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(math.nan, dpa.GaussianDpEvent(1.0)), 3),
              r"PoissonSampledDpEvent\.sampling_probability must be a number, got nan"),
             (dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.LaplaceDpEvent(math.nan)]),
              r"LaplaceDpEvent\.noise_multiplier must be a number, got nan"),
             (dpa.GaussianDpEvent("1"), r"GaussianDpEvent\.noise_multiplier must be a number, got '1'")]
    for event, message in cases:
        for accountant in ("rdp", "pld", "best"):
            with pytest.raises(ValueError, match=message):
                acc.compute_epsilon(event, 1e-6, accountant=accountant)
        with pytest.raises(ValueError, match=message):
            PrivacyLedger(10.0, 1e-6).spend("x", event)
    with pytest.raises(ValueError, match=r"events must be a dp_accounting DpEvent or a list of them, got int 3"):
        acc.compute_epsilon(3, 1e-6)
    # a declared text field is not a number (the DDG event's neighbouring relation): still accounted
    from fedpriv.dp import ddg
    event = ddg.ddg_event(ddg.DDGConfig(dim=10, num_clients=5, clip=1.0, noise_multiplier=1.0, bits=16), 5)
    assert 0 < acc.compute_epsilon(event, 1e-6, "replace_one", "rdp")[0] < math.inf
    # infinite noise releases nothing, under every accountant
    for accountant in ("rdp", "pld", "best"):
        assert acc.compute_epsilon(dpa.GaussianDpEvent(math.inf), 1e-6, accountant=accountant)[0] == 0.0


def test_calibration_refuses_with_the_users_own_numbers():
    from fedpriv.dp import accounting as acc
    make = lambda z: acc.dp_ftrl_event(z, 100)  # noqa: E731
    with pytest.raises(acc.CalibrationError, match=r"epsilon 1e-09 is too small to calibrate at delta 1e-06: "
                                                   r"even the largest noise multiplier accepted \(1e\+06\) gives "
                                                   r"epsilon 0\.00\d+"):
        acc.calibrate_noise_multiplier(make, 1e-9, 1e-6, accountant="rdp")
    with pytest.raises(acc.CalibrationError, match=r"make_event must return a dp_accounting DpEvent; "
                                                   r"make_event\(0\.1\) returned None"):
        acc.calibrate_noise_multiplier(lambda z: None, 1.0, 1e-6)


def test_privacy_calibrate_cli_does_not_name_a_multiplier_the_user_never_gave(capsys):
    from fedpriv.cli import main

    def call(argv):
        try:
            return main(argv), capsys.readouterr().err
        except SystemExit as e:
            return e.code, capsys.readouterr().err
    rc, err = call(["privacy", "calibrate", "dp-ftrl", "--epsilon", "1e-9", "--rounds", "100", "--delta", "1e-6"])
    assert rc == 2 and err.count("\n") == 1 and "epsilon 1e-09 is too small to calibrate" in err
    assert "1887436" not in err  # the multiplier the bisection reached, never given by the user
    rc, err = call(["privacy", "dp-ftrl", "--noise-multiplier", "1", "--rounds", "10", "--delta", "0.999999"])
    assert rc == 2 and "delta must be in (0, 0.001], got 0.999999" in err


def test_delta_that_is_no_guarantee_is_refused_everywhere():
    import dp_accounting as dpa

    from fedpriv.dp import accounting as acc
    from fedpriv.dp.ledger import PrivacyLedger
    for delta in (0.999999, 0.1, 0.0011):
        with pytest.raises(ValueError, match=r"delta must be in \(0, 0\.001\]"):
            acc.compute_epsilon(dpa.GaussianDpEvent(1.0), delta)
        with pytest.raises(ValueError, match=r"delta must be in \(0, 0\.001\]"):
            PrivacyLedger(1.0, delta)
        with pytest.raises(ValueError, match=r"delta must be in \(0, 0\.001\]"):
            acc.calibrate_noise_multiplier(lambda z: dpa.GaussianDpEvent(z), 1.0, delta)
    assert acc.check_delta(acc.MAX_DELTA) == 1e-3


def test_an_infinite_clip_is_refused_where_a_sensitivity_is_stated():
    """``clip_update(u, inf)`` is no clipping (noise-free FedAvg, kept); a sensitivity stated
    from an infinite clip (DP moments / FreD, DDG, a noised DPConfig) is refused."""
    from fedpriv.dp import ddg, moments
    from fedpriv.dp.clipping import ClipNormError
    from fedpriv.fl.algorithms import DPConfig
    from fedpriv.fred import private
    clipped, norm, finite = clip_update(_U, math.inf)
    assert bool(finite) and float(norm) == pytest.approx(13.0) and np.allclose(clipped["w"], _U["w"])
    for call in (lambda: moments.moment_sensitivities(math.inf, 1.0, "add_remove"),
                 lambda: private.sensitivities(1.0, math.inf, "user", "replace_one"),
                 lambda: ddg.DDGConfig(dim=4, num_clients=3, clip=math.inf, noise_multiplier=1.0, bits=16)):
        with pytest.raises(ClipNormError, match=r"must be a finite number > 0 \(it bounds the sensitivity; "
                                                r"inf = no clipping has none\), got inf"):
            call()
    with pytest.raises(ValueError, match=r"noise needs a finite clip norm"):
        DPConfig(clip_norm=math.inf, noise_multiplier=1.0)


# ----------------------------------------------------------------------------- train / load_run
def _train_case(over):
    import optax

    from fedpriv.fl.algorithms import DPConfig, build_algorithm
    from fedpriv.fl.loop import train
    from tests.fl.helpers import init_params, loss_fn, make_dataset
    data = make_dataset(num_clients=6)
    ids = list(data)
    args = dict(algorithm=build_algorithm(loss_fn, optax.sgd(0.05), optax.sgd(0.7), DPConfig(),
                                          expected_cohort_size=2),
                init_params=init_params(), dataset=data, client_ids=ids, sampler=UniformSampler(6, 2),
                rounds=2, batch_size=4, seed=0, progress=False, log=None)
    args.update(over(data, ids) if callable(over) else over)
    return train(**args)


@pytest.mark.parametrize("over, cls, message", [
    (lambda d, ids: dict(client_ids=ids[:5] + ["nobody"]), ValueError,
     r"client ids not in the dataset: 'nobody' \(1 of 6 client_ids\)"),
    (lambda d, ids: dict(client_ids=ids[:5] + ids[:1]), ValueError,
     r"client_ids repeat 'client000': each population member must be a distinct user"),
    (lambda d, ids: dict(client_ids="abcdef"), ValueError,
     r"client_ids must be a sequence of client ids, not a string"),
    (lambda d, ids: dict(dataset=[d[c] for c in ids]), ValueError,
     r"dataset must be a mapping client id -> dict of example arrays, got list"),
    (lambda d, ids: dict(dataset={**d, ids[3]: {"x": np.zeros((4, 7), np.float32), "y": np.zeros(4, np.float32)}}),
     ValueError, r"client 'client003' has fields \{'x': \(7,\), 'y': \(\)\} but client 'client000' has "
                 r"\{'x': \(5,\), 'y': \(\)\}"),
    (lambda d, ids: dict(dataset={**d, ids[2]: {"x": np.zeros((0, 5), np.float32), "y": np.zeros(0, np.float32)}}),
     ValueError, r"client 'client002' has no examples"),
    (lambda d, ids: dict(dataset={c: {"x": np.array(["a"] * 4), "y": np.zeros(4, np.float32)} for c in ids}),
     ValueError, r"client 'client000': field 'x' must be a numeric array"),
    (lambda d, ids: dict(init_params={"w": jnp.zeros((5,), jnp.int32), "b": jnp.zeros((), jnp.int32)}),
     ValueError, r"init_params\['b'\] has dtype int32: parameters must be floating point"),
    (lambda d, ids: dict(init_params=None), ValueError, r"init_params has no arrays \(got NoneType\)"),
    # parameters of another model: the dry run names them (was a dot_general TypeError traceback)
    (lambda d, ids: dict(init_params={"w": jnp.zeros((3,)), "b": jnp.zeros(())}), TypeError,
     r"one round cannot be traced on init_params \(\['b'\]: float32\[\], \['w'\]: float32\[3\]\) and the "
     r"examples of client 'client000' \(\['x'\]: float32\[\d+, 5\], \['y'\]: float32\[\d+\]\): TypeError: "
     r"dot_general requires contracting dimensions to have the same shape"),
    (lambda d, ids: dict(init_params={"w": jnp.zeros((5,))}), KeyError,
     r"one round cannot be traced on init_params \(\['w'\]: float32\[5\]\).*KeyError: 'b'"),
    (lambda d, ids: dict(seed=-1), ValueError, r"seed must be an integer in \[0, 2\^63\), got -1"),
    (lambda d, ids: dict(seed=2**70), ValueError, r"seed must be an integer in \[0, 2\^63\)"),
    (lambda d, ids: dict(seed=jax.random.key(0)), ValueError, r"got a PRNGKeyArray .*pass an int, not a key"),
    (lambda d, ids: dict(batch_size=2.5), ValueError, r"batch_size must be an integer >= 1, got 2\.5"),
    (lambda d, ids: dict(max_steps=0), ValueError, r"max_steps must be an integer >= 1, got 0"),
    (lambda d, ids: dict(eval_every=-1), ValueError, r"eval_every must be an integer >= 0, got -1"),
    (lambda d, ids: dict(algorithm=None), ValueError, r"algorithm must be a FederatedAlgorithm"),
])
def test_train_misuse_is_one_line_before_round_0(tmp_path, over, cls, message):
    from fedpriv.fl.inputs import TrainInputError
    with pytest.raises(cls, match=message) as err:
        _train_case(lambda d, ids: {**over(d, ids), "workdir": str(tmp_path / "wd")})
    assert isinstance(err.value, (TrainInputError, ValueError)) and "\n" not in str(err.value)
    assert not (tmp_path / "wd" / "metrics.jsonl").exists()  # nothing ran


def test_load_run_refuses_a_template_that_is_not_a_server_state(tmp_path):
    from fedpriv.fl.inputs import TrainInputError
    from fedpriv.fl.loop import load_run
    from tests.fl.helpers import init_params
    with pytest.raises(TrainInputError, match=r"template must be a ServerState \(algorithm\.init\(params, key\)\), "
                                              r"got dict"):
        load_run(str(tmp_path), init_params())


def test_a_bar_chart_of_values_that_overflowed_is_still_written(tmp_path):
    """fred_pipeline at total_epsilon=1.0 ran every stage, then its plot crashed on a perplexity
    that overflowed (mean None): such a bar is left out and marked n/a."""
    from fedpriv.report import bar_chart
    for log in (False, True):
        path = bar_chart({"a": {"x": {"s1": (1.0, 0.1), "s2": (None, None)}, "y": {"s1": (math.inf, 0.0)}},
                          "b": {"z": {"q": (None, None)}}}, str(tmp_path / f"c{log}.png"), "ppl", log=log)
        assert os.path.getsize(path) > 0


def test_a_jax_backend_the_environment_cannot_start_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")

    def needs_tpu(argv):
        raise RuntimeError("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so (set "
                           "JAX_PLATFORMS='' to automatically choose an available backend)")
    with pytest.raises(SystemExit) as e:
        common.cli(needs_tpu, [])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "error: JAX_PLATFORMS='tpu': Unable to initialize " \
        "backend 'tpu'" in err

    def bug(argv):
        raise RuntimeError("a genuine bug")
    with pytest.raises(RuntimeError, match="a genuine bug"):
        common.cli(bug, [])
