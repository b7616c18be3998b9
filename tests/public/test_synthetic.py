"""The public pool synthesised by the public LLM (fedpriv.public.synthetic), on a tiny random LLM:
an interrupted and resumed pool is byte for byte the uninterrupted one (a crash's partial chunk
too), a pool of other settings or another teacher is refused and left as it was, every message
answers instruction i mod W across chunks, and the CLI refuses bad input in one line (exit 2)."""
import json
import os

import jax
import pytest

from fedpriv.models import llama
from fedpriv.public import synthetic as S
from fedpriv.synth import evolve as E

CFG = llama.LlamaConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=24)


class _Enc:
    def __init__(self, ids):
        self.ids = ids


class _Tok:  # characters -> ids 4..39; id 3 decodes to a sentence end; id 2 ends the turn
    def encode(self, text, add_special_tokens=False):
        return _Enc([4 + ord(c) % 36 for c in text])

    def decode(self, ids, skip_special_tokens=True):
        return " ".join("." if i == 3 else f"w{i}" for i in ids if i > 2)

    def token_to_id(self, s):
        return 2 if s == "<|im_end|>" else None


def _teacher(fingerprint="t"):
    params = llama.init_params(jax.random.key(0), CFG, 0.5)
    return llama.Teacher(params=params, config=CFG, tokenizer=_Tok(), fingerprint=fingerprint,
                         bos_id=0, eos_id=0)


@pytest.fixture(scope="module")
def teacher():
    return _teacher()


def _settings(**kw):
    return S.SynthSettings(**{**dict(messages=12, chunk=4, max_new=5, top_k=0, batch_size=8,
                                     instructions=("say hi", "ask me", "tell me")), **kw})


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_resumed_pool_is_the_uninterrupted_pool(teacher, tmp_path):
    whole = str(tmp_path / "whole.txt")
    m = S.synthesize(teacher, _settings(), whole, progress=False)
    assert m["complete"] and m["chunks_done"] == 3 and m["written"] + m["empty"] == 12
    assert len(_read(whole).decode().splitlines()) == m["written"] > 0
    part = str(tmp_path / "part.txt")
    # a deadline already past: nothing generated, the sidecar says so
    m0 = S.synthesize(teacher, _settings(), part, deadline_s=1e-12, progress=False)
    assert m0["chunks_done"] == 0 and not m0["complete"] and _read(part) == b""
    # one chunk, then a crash mid-chunk (bytes past the sidecar's count), then the rest
    S.synthesize(teacher, _settings(messages=4), part, progress=False)
    with open(part, "ab") as f:
        f.write(b"half a chunk\n")
    m2 = S.synthesize(teacher, _settings(), part, progress=False)
    assert _read(part) == _read(whole)
    assert {k: m2[k] for k in ("written", "empty", "tokens", "chunks_done", "bytes")} == \
           {k: m[k] for k in ("written", "empty", "tokens", "chunks_done", "bytes")}


def test_other_settings_or_teacher_refused_and_pool_kept(teacher, tmp_path):
    out = str(tmp_path / "p.txt")
    S.synthesize(teacher, _settings(messages=4), out, progress=False)
    before, meta = _read(out), _read(out + ".json")
    for bad_teacher, bad in ((teacher, _settings(seed=1)), (teacher, _settings(max_new=6)),
                             (teacher, _settings(instructions=("say hi",))),
                             (_teacher("another"), _settings())):
        with pytest.raises(ValueError, match="other settings|another teacher"):
            S.synthesize(bad_teacher, bad, out, progress=False)
        assert _read(out) == before and _read(out + ".json") == meta
    # the batch size is speed only: a resume with another one continues the same pool
    S.synthesize(teacher, _settings(batch_size=16, messages=8), out, progress=False)
    assert _read(out).startswith(before)
    # a file this tool did not write, or a sidecar without its pool: refused
    stray = tmp_path / "stray.txt"
    stray.write_text("mine\n")
    with pytest.raises(ValueError, match="without its sidecar"):
        S.synthesize(teacher, _settings(), str(stray), progress=False)
    assert stray.read_text() == "mine\n"
    # a partial last chunk cannot be extended, and a pool is never cut to fewer messages
    part = str(tmp_path / "part.txt")
    S.synthesize(teacher, _settings(messages=6), part, progress=False)  # chunks of 4 and 2
    for n, match in ((12, "last chunk holds 2 of 4"), (3, "already holds the generations of 6")):
        with pytest.raises(ValueError, match=match):
            S.synthesize(teacher, _settings(messages=n), part, progress=False)
    assert S.synthesize(teacher, _settings(messages=6), part, progress=False)["complete"]
    os.replace(out, str(tmp_path / "moved.txt"))
    with pytest.raises(ValueError, match="does not"):
        S.synthesize(teacher, _settings(), out, progress=False)


def test_message_i_answers_instruction_i_mod_w(teacher, tmp_path, monkeypatch):
    seen = []
    real = E.initial_samples

    def spy(t, prompts, n, key, s, stats):
        seen.extend(prompts[i % len(prompts)] for i in range(n))
        return real(t, prompts, n, key, s, stats)

    monkeypatch.setattr(E, "initial_samples", spy)
    st = _settings(messages=10, chunk=4)  # chunks of 4 over 3 instructions: rotations 0, 1, 2
    S.synthesize(teacher, st, str(tmp_path / "p.txt"), progress=False)
    prompts = [E.chat_prompt(teacher, s) for s in st.instructions]
    assert seen == [prompts[i % 3] for i in range(10)]


def test_truncated_message_loses_its_unfinished_sentence(tmp_path, monkeypatch):
    t = _teacher()
    # ids 5 6 3 7 8 at max_new = 5: "w5 w6 . w7 w8" was cut off -> "w5 w6 ."
    monkeypatch.setattr(E, "initial_samples", lambda tt, p, n, k, s, st: [E.Sample(0, (5, 6, 3, 7, 8))] * n)
    out = str(tmp_path / "p.txt")
    m = S.synthesize(t, _settings(messages=2, chunk=2), out, progress=False)
    assert _read(out).decode().splitlines() == ["w5 w6 ."] * 2 and m["truncated"] == 2
    # a short (finished) message is kept whole
    monkeypatch.setattr(E, "initial_samples", lambda tt, p, n, k, s, st: [E.Sample(0, (5, 3, 7))] * n)
    out2 = str(tmp_path / "q.txt")
    m2 = S.synthesize(t, _settings(messages=2, chunk=2), out2, progress=False)
    assert _read(out2).decode().splitlines() == ["w5 . w7"] * 2 and m2["truncated"] == 0


@pytest.mark.parametrize("kw", [dict(messages=0), dict(chunk=-1), dict(max_new=True),
                                dict(temperature=0.0), dict(top_k=-1), dict(instructions=()),
                                dict(instructions=(" ",))])
def test_bad_settings_refused(kw):
    with pytest.raises(ValueError):
        S.SynthSettings(**kw)


@pytest.mark.parametrize("argv,needle", [
    (["--out", "pool.jsonl"], "--out must be a .txt"),
    (["--out", "p.txt", "--messages", "0"], "messages must be a positive integer"),
    (["--out", "p.txt", "--deadline-s", "-1"], "--deadline-s must be > 0"),
    (["--out", "p.txt", "--seed", "1", "--seed", "2"], "given twice"),
])
def test_cli_refuses_bad_input_in_one_line(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        S.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and err.count("\n") == 1
    assert not os.listdir(tmp_path)


def test_sidecar_records_what_the_pool_is(teacher, tmp_path):
    out = str(tmp_path / "p.txt")
    S.synthesize(teacher, _settings(), out, progress=False)
    meta = json.loads(_read(out + ".json"))
    assert meta["settings"] == _settings().identity() and meta["teacher_sha256"] == "t"
    assert meta["bytes"] == os.path.getsize(out) and meta["messages_requested"] == 12
