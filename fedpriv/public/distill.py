"""Top-k distillation from the public teacher LLM (Wang et al. 2023, §4.1 and App. B.3).

Three pieces, kept in one module (~580 lines) on purpose: the corpus format, the vocabulary
restriction that maps it onto a student's vocabulary and the KD loss that consumes it are one
data contract (array names, renormalisation over the kept ids, the special ids), and every
change to one touches the others.

**(a) The distillation corpus** (§4.1, "Building a distillation corpus"). For every public
sequence the teacher's top-k next-token logits z_T are computed once, at every position, and
stored on disk in a model-agnostic format, so any on-device student (LSTM, transformer, any
size) can be pre-/mid-trained from it. A corpus is a directory::

    manifest.json            format, teacher sha256 + vocab size + bos/eos, k, seq_len,
                             temperature (1.0: logits are stored unscaled; the KD temperature is
                             applied at training time, so one corpus serves every t), dtype,
                             number of sequences, shard list, cache key
    shard-00000.npz ...      token_ids   int32[n, L+1]  teacher ids: BOS, up to L text tokens,
                                                         EOS if it fits, then padding
                             lengths     int32[n]       real tokens in token_ids (incl. BOS), >= 2
                             topk_ids    int32[n, L, k] teacher's top-k ids predicting token i+1
                             topk_logits f16/f32[n, L, k] their logits (sorted, descending)
                             logsumexp   float32[n, L]  the full-vocabulary log-partition, so
                                                         exp(topk_logits - logsumexp) are the
                                                         teacher's true probabilities

Positions i >= lengths-1 are padding (ids 0, logits 0). The directory name is a hash of the
inputs (token ids, k, L, dtype, teacher sha256, format version): building twice with the same
inputs is a cache hit, and an interrupted build resumes at the first missing shard.

**(b) Vocabulary restriction** for CPU-scale students. In the paper the student shares the
teacher's vocabulary (§4.1: "we align the tokenizer of the on-device LM with the LLM"). A
49,152-row output layer is too large for CPU-scale DP-FL experiments, so `VocabRestriction` keeps
the V most frequent (non-control) teacher tokens of the data and maps all others to UNK, with the
project's id convention PAD=0, UNK=1, BOS=2, EOS=3, then the kept teacher tokens in decreasing
frequency (student vocabulary size V+4). The teacher's document token opens every sequence (->
BOS) and closes it (-> EOS). The teacher's sparse top-k distribution is *renormalised over the
kept ids*: dropped ids are removed from the top-k (their logits become -inf) and the softmax is
taken over the remaining ones; a position whose top-k is entirely dropped carries no KD signal.
(Lumping dropped mass onto UNK would teach the student to predict UNK; we do not.)
`restriction_cost` measures the price: the UNK rate of targets, the teacher's probability mass on
dropped top-k ids (true, full-vocabulary mass and within-top-k share), and the share of positions
left without a teacher. `VocabRestriction.full` keeps every non-control teacher token (the
paper's shared-vocabulary setting under the same id convention).

**(c) The loss** (§4.1): ``L_pub = L_LM + β·L_KD`` with ``L_LM = CE(z_S, y)`` and
``L_KD = CE(z_S/t, z_T/t)`` against the sparse top-k teacher:

    p_T(j)   = softmax_{j ∈ topk}(z_T,j / t)           (over kept top-k ids only)
    L_KD     = − Σ_{j ∈ topk} p_T(j) · log_softmax(z_S / t)_j   (student: full vocabulary)

both averaged over non-PAD targets of real examples. App. B.3 uses t=1, k=10 and
β ∈ {1e-1, 1e-2, 1e-3}. No t² factor is applied (the paper's loss has none).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fedpriv.models import bucketing, llama, metrics

NUM_SPECIAL = 4
FORMAT = "fedpriv-topk-v1"
MANIFEST = "manifest.json"


# ----------------------------------------------------------------------------------------------
# (a) The distillation corpus
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TopKCorpus:
    """A loaded distillation corpus (arrays documented in the module docstring)."""

    token_ids: np.ndarray    # int32[N, L+1]
    lengths: np.ndarray      # int32[N]
    topk_ids: np.ndarray     # int32[N, L, k]
    topk_logits: np.ndarray  # float16 or float32 [N, L, k]
    logsumexp: np.ndarray    # float32[N, L]
    manifest: dict
    path: Path
    from_cache: bool = False

    @property
    def num_sequences(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.topk_ids.shape[1])

    @property
    def k(self) -> int:
        return int(self.topk_ids.shape[2])

    def position_mask(self) -> np.ndarray:
        """bool[N, L]: True where position i predicts a real token (i < lengths-1)."""
        return np.arange(self.seq_len)[None, :] < (self.lengths[:, None] - 1)

    def nbytes(self) -> int:
        """Bytes on disk (all shards + manifest)."""
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())


def prepare_sequences(teacher: llama.Teacher, texts_or_ids: Iterable, seq_len: int,
                      append_eos: bool = True) -> list[list[int]]:
    """Teacher-id sequences in corpus form: [BOS] + first `seq_len` tokens (+ EOS if it fits).

    Args:
      texts_or_ids: N strings (tokenized with the teacher) or N teacher-id sequences (no BOS).
      seq_len: L, the number of predicted positions (the paper uses 20, App. B.2).
      append_eos: append the teacher's EOS when the text has fewer than L tokens (so the student
        learns to end a sequence, as the project's examples end with EOS).

    Returns:
      N lists of length 2..L+1 (a text with no tokens and append_eos=False raises ValueError).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    out = []
    for n, item in enumerate(texts_or_ids):
        ids = teacher.encode(item) if isinstance(item, str) else [int(i) for i in item]
        seq = [teacher.bos_id] + ids[:seq_len]
        if append_eos and len(ids) < seq_len:
            seq.append(teacher.eos_id)
        if len(seq) < 2:
            raise ValueError(f"sequence {n} is empty (nothing to predict)")
        out.append(seq)
    return out


def _pad_rows(seqs: Sequence[Sequence[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(seqs), width), np.int32)
    lengths = np.zeros((len(seqs),), np.int32)
    for i, s in enumerate(seqs):
        if len(s) > width:
            raise ValueError(f"sequence {i} has {len(s)} tokens > L+1 = {width}")
        ids[i, :len(s)] = s
        lengths[i] = len(s)
    return ids, lengths


def corpus_key(teacher: llama.Teacher, token_ids: np.ndarray, lengths: np.ndarray, k: int,
               logits_dtype: str) -> str:
    """Hex sha256 identifying a corpus: inputs, k, L, dtype, teacher file, format version."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": FORMAT, "teacher": teacher.fingerprint, "k": int(k),
                         "shape": list(token_ids.shape), "dtype": logits_dtype},
                        sort_keys=True).encode())
    h.update(np.ascontiguousarray(token_ids, np.int32).tobytes())
    h.update(np.ascontiguousarray(lengths, np.int32).tobytes())
    return h.hexdigest()


def _topk_impl(params, config: llama.LlamaConfig, k: int, ids, mask):
    logits = llama.forward(params, config, ids, mask)[:, :-1]  # [B, L, V]
    vals, idx = jax.lax.top_k(logits, k)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return {"topk_ids": idx.astype(jnp.int32), "topk_logits": vals, "logsumexp": lse}


_topk_jit = jax.jit(_topk_impl, static_argnums=(1, 2))


def _topk_fn(teacher: llama.Teacher, k: int):
    """(ids int32[B, L+1], mask) -> top-k ids/logits [B, L, k] and logsumexp [B, L]."""
    return lambda ids, mask: _topk_jit(teacher.params, teacher.config, k, jnp.asarray(ids),
                                       jnp.asarray(mask))


def _shard_matches(path: Path, token_ids: np.ndarray) -> bool:
    """Whether a shard left by an interrupted build holds exactly these sequences."""
    if not path.is_file():
        return False
    try:
        with np.load(path) as z:
            return np.array_equal(z["token_ids"], token_ids)
    except (OSError, ValueError, KeyError):
        return False


def _write_shard(path: Path, fn, token_ids, lengths, start: int, stop: int, seq_len: int, k: int,
                 batch_size: int, logits_dtype: str, compress: bool, progress: bool, desc: str):
    """The teacher's top-k over sequences ``start:stop`` (padded targets zeroed), written
    atomically to the shard ``path``."""
    seqs = [token_ids[i, :lengths[i]] for i in range(start, stop)]
    outs = bucketing.map_bucketed(fn, seqs, batch_size=batch_size, buckets=(seq_len + 1,),
                                  trim=False, progress=progress, desc=desc)
    arrays = {name_: np.stack([o[name_] for o in outs]) for name_ in outs[0]}
    valid = (np.arange(seq_len)[None, :] < (lengths[start:stop, None] - 1))
    arrays["topk_ids"] = np.where(valid[..., None], arrays["topk_ids"], 0).astype(np.int32)
    arrays["topk_logits"] = np.where(valid[..., None], arrays["topk_logits"], 0).astype(logits_dtype)
    arrays["logsumexp"] = np.where(valid, arrays["logsumexp"], 0).astype(np.float32)
    tmp = path.with_name(path.name + ".tmp.npz")
    (np.savez_compressed if compress else np.savez)(tmp, token_ids=token_ids[start:stop],
                                                    lengths=lengths[start:stop], **arrays)
    os.replace(tmp, path)


def build_topk_corpus(teacher: llama.Teacher, sequences: Sequence[Sequence[int]], *,
                      cache_dir: str | os.PathLike, k: int = 10, seq_len: int = 20,
                      batch_size: int = 32, shard_size: int = 4096,
                      logits_dtype: str = "float16", compress: bool = False,
                      progress: bool = True) -> TopKCorpus:
    """Run the teacher over `sequences` and store its top-k logits (or load them from cache).

    Args:
      teacher: `fedpriv.models.llama.Teacher`.
      sequences: N teacher-id sequences in corpus form (`prepare_sequences`: BOS first,
        2..L+1 tokens).
      cache_dir: parent directory; the corpus lives in `cache_dir/topk-<key[:16]>`.
      k: top-k (paper: 10). seq_len: L (paper: 20).
      batch_size: teacher batch (all batches are padded to [batch_size, L+1]: one compilation).
      shard_size: sequences per .npz shard.
      logits_dtype: "float16" (default, half the size) or "float32".
      compress: write zip-deflated shards (about half the bytes at k=10, L=20; slower to load).
        The content, and so the cache key, is the same either way.
      progress: tqdm bars (tokens/second of the teacher).

    Returns:
      `TopKCorpus`; `from_cache` tells whether the teacher was skipped.
    """
    if not 1 <= k <= teacher.config.vocab_size:
        raise ValueError(f"k must be in [1, {teacher.config.vocab_size}], got {k}")
    if logits_dtype not in ("float16", "float32"):
        raise ValueError(f"logits_dtype must be float16 or float32, got {logits_dtype!r}")
    if not len(sequences):
        raise ValueError("no sequences to distil")
    token_ids, lengths = _pad_rows(sequences, seq_len + 1)
    if lengths.min() < 2:
        raise ValueError("every sequence needs >= 2 tokens (BOS and one target)")
    key = corpus_key(teacher, token_ids, lengths, k, logits_dtype)
    final = Path(cache_dir) / f"topk-{key[:16]}"
    cached = _cached_corpus(final, key)
    if cached is not None:
        return cached
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    # one builder per key at a time (processes, e.g. test workers, sharing a cache): the
    # others wait, then find the finished corpus; an interrupted build resumes its shards
    with open(Path(cache_dir) / f"topk-{key[:16]}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _cached_corpus(final, key)
        if cached is not None:
            return cached
        partial = Path(cache_dir) / f"topk-{key[:16]}.partial"
        partial.mkdir(parents=True, exist_ok=True)
        fn = _topk_fn(teacher, k)
        shards = []
        n = len(token_ids)
        for s, start in enumerate(range(0, n, shard_size)):
            name = f"shard-{s:05d}.npz"
            stop = min(start + shard_size, n)
            shards.append({"file": name, "num_sequences": stop - start})
            if _shard_matches(partial / name, token_ids[start:stop]):
                continue  # resumed build: this shard was finished before the interruption
            _write_shard(partial / name, fn, token_ids, lengths, start, stop, seq_len, k,
                         batch_size, logits_dtype, compress, progress,
                         f"top-{k} shard {s + 1}/{-(-n // shard_size)}")
        manifest = {
            "format": FORMAT, "key": key,
            "teacher": {"sha256": teacher.fingerprint, "file": os.path.basename(teacher.path or ""),
                        "vocab_size": teacher.config.vocab_size, "bos_id": teacher.bos_id,
                        "eos_id": teacher.eos_id, "special_ids": list(teacher.special_ids)},
            "k": int(k), "seq_len": int(seq_len), "temperature": 1.0,
            "logits_dtype": logits_dtype, "num_sequences": int(n), "shards": shards,
        }
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if final.exists():  # a stale or foreign directory under our key
            shutil.rmtree(final)
        os.replace(partial, final)
        return load_topk_corpus(final)


def _cached_corpus(final: Path, key: str) -> TopKCorpus | None:
    if (final / MANIFEST).is_file():
        corpus = load_topk_corpus(final)
        if corpus.manifest.get("key") == key:
            return dataclasses.replace(corpus, from_cache=True)
    return None


def load_topk_corpus(path: str | os.PathLike) -> TopKCorpus:
    """Load a corpus directory written by `build_topk_corpus` (ids as int32)."""
    path = Path(path)
    manifest = json.loads((path / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown corpus format {manifest.get('format')!r}")
    parts: dict[str, list] = {}
    for shard in manifest["shards"]:
        with np.load(path / shard["file"]) as z:
            for name in ("token_ids", "lengths", "topk_ids", "topk_logits", "logsumexp"):
                parts.setdefault(name, []).append(z[name])
    arrays = {name: np.concatenate(v) for name, v in parts.items()}
    for name in ("token_ids", "lengths", "topk_ids"):
        arrays[name] = arrays[name].astype(np.int32)
    if len(arrays["token_ids"]) != manifest["num_sequences"]:
        raise ValueError(f"{path}: shards hold {len(arrays['token_ids'])} sequences, manifest "
                         f"says {manifest['num_sequences']}")
    return TopKCorpus(manifest=manifest, path=path, **arrays)


# ----------------------------------------------------------------------------------------------
# (b) Vocabulary restriction
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VocabRestriction:
    """Student vocabulary = PAD, UNK, BOS, EOS + kept teacher tokens (most frequent first).

    Attributes:
      kept_teacher_ids: int32[K]; student id 4+j is teacher id kept_teacher_ids[j].
      teacher_to_student: int32[V_teacher]; UNK for dropped and control ids, EOS for the
        teacher's document token (a BOS is only ever the first input, mapped positionally).
      student_to_teacher: int32[K+4]; -1 for PAD and UNK, the teacher's bos/eos for BOS/EOS.
      teacher_bos_id, teacher_eos_id: the teacher's document tokens.
    """

    kept_teacher_ids: np.ndarray
    teacher_to_student: np.ndarray
    student_to_teacher: np.ndarray
    teacher_bos_id: int
    teacher_eos_id: int

    @property
    def student_vocab_size(self) -> int:
        return int(self.student_to_teacher.shape[0])

    @classmethod
    def from_kept(cls, kept_teacher_ids: Sequence[int], teacher_vocab_size: int,
                  teacher_bos_id: int, teacher_eos_id: int) -> "VocabRestriction":
        kept = np.asarray(kept_teacher_ids, np.int32).reshape(-1)
        if len(np.unique(kept)) != len(kept):
            raise ValueError("kept teacher ids must be distinct")
        if np.isin([teacher_bos_id, teacher_eos_id], kept).any():
            raise ValueError("the teacher's BOS/EOS map to the student's BOS/EOS; do not keep them")
        t2s = np.full((teacher_vocab_size,), UNK_ID, np.int32)
        t2s[kept] = NUM_SPECIAL + np.arange(len(kept), dtype=np.int32)
        t2s[teacher_eos_id] = EOS_ID
        s2t = np.concatenate([np.array([-1, -1, teacher_bos_id, teacher_eos_id], np.int32), kept])
        return cls(kept, t2s, s2t, int(teacher_bos_id), int(teacher_eos_id))

    @classmethod
    def full(cls, teacher: llama.Teacher) -> "VocabRestriction":
        """No restriction: every non-control teacher token is kept (in teacher-id order)."""
        drop = set(teacher.special_ids) | {teacher.bos_id, teacher.eos_id}
        kept = [i for i in range(teacher.config.vocab_size) if i not in drop]
        return cls.from_kept(kept, teacher.config.vocab_size, teacher.bos_id, teacher.eos_id)

    def to_student(self, teacher_ids: np.ndarray) -> np.ndarray:
        """Map teacher ids (any shape) to student ids; BOS positions must be handled by caller."""
        return self.teacher_to_student[np.asarray(teacher_ids)]

    def to_teacher(self, student_ids: np.ndarray) -> np.ndarray:
        """Map student ids (any shape) to teacher ids; PAD/UNK -> -1."""
        return self.student_to_teacher[np.asarray(student_ids)]


def token_frequencies(sequences: Iterable[Sequence[int]] | TopKCorpus,
                      teacher_vocab_size: int) -> np.ndarray:
    """int64[V_teacher] counts of teacher ids over sequences (a corpus: its real tokens)."""
    if isinstance(sequences, TopKCorpus):
        real = np.arange(sequences.token_ids.shape[1])[None, :] < sequences.lengths[:, None]
        flat = sequences.token_ids[real]
    else:
        flat = np.concatenate([np.asarray(s, np.int64).reshape(-1) for s in sequences] or
                              [np.zeros((0,), np.int64)])
    if len(flat) and (flat.min() < 0 or flat.max() >= teacher_vocab_size):
        raise ValueError(f"token ids outside the teacher vocabulary [0, {teacher_vocab_size})")
    return np.bincount(flat.astype(np.int64), minlength=teacher_vocab_size).astype(np.int64)


def build_vocab_restriction(sequences: Iterable[Sequence[int]] | TopKCorpus, num_kept: int,
                            teacher: llama.Teacher) -> VocabRestriction:
    """Keep the `num_kept` most frequent non-control teacher tokens of the data.

    Ties are broken by smaller teacher id; tokens that never occur are not kept (so fewer than
    `num_kept` may be kept on small data). Student vocabulary size = 4 + number kept.

    Args:
      sequences: teacher-id sequences (e.g. the public corpus, or `TopKCorpus`).
      num_kept: V.
      teacher: gives the teacher vocabulary size, control ids and bos/eos ids.
    """
    if num_kept < 1:
        raise ValueError(f"num_kept must be >= 1, got {num_kept}")
    vocab = teacher.config.vocab_size
    counts = token_frequencies(sequences, vocab).astype(np.int64)
    drop = np.array(sorted(set(teacher.special_ids) | {teacher.bos_id, teacher.eos_id}), np.int64)
    counts[drop] = 0
    order = np.lexsort((np.arange(vocab), -counts))  # by count desc, then id asc
    kept = order[:num_kept]
    kept = kept[counts[kept] > 0]
    return VocabRestriction.from_kept(kept, vocab, teacher.bos_id, teacher.eos_id)


def restrict_topk(topk_ids: np.ndarray, topk_logits: np.ndarray, restriction: VocabRestriction,
                  valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Map a teacher top-k to student ids, dropping ids outside the student vocabulary.

    Args:
      topk_ids: int[..., k] teacher ids. topk_logits: float[..., k].
      valid: optional bool[...] (False at padding positions: every entry dropped there).

    Returns:
      (student ids int32[..., k], logits float32[..., k]) with dropped entries set to id PAD and
      logit -inf, so softmax over the last axis renormalises over the kept ids.
    """
    sid = restriction.to_student(topk_ids)
    keep = sid != UNK_ID
    if valid is not None:
        keep &= np.asarray(valid, bool)[..., None]
    return (np.where(keep, sid, PAD_ID).astype(np.int32),
            np.where(keep, np.asarray(topk_logits, np.float32), -np.inf).astype(np.float32))


def corpus_to_student(corpus: TopKCorpus, restriction: VocabRestriction) -> dict[str, np.ndarray]:
    """The corpus as student training arrays (the distillation batch format, all N rows).

    Returns:
      {'tokens': int32[N, L+1] (BOS, mapped ids, EOS, PAD), 'mask': float32[N] (ones),
       'topk_ids': int32[N, L, k], 'topk_logits': float32[N, L, k] (-inf = no teacher mass)}.
    """
    real = np.arange(corpus.token_ids.shape[1])[None, :] < corpus.lengths[:, None]
    tokens = np.where(real, restriction.to_student(corpus.token_ids), PAD_ID).astype(np.int32)
    tokens[:, 0] = BOS_ID
    ids, logits = restrict_topk(corpus.topk_ids, corpus.topk_logits, restriction,
                                corpus.position_mask())
    return {"tokens": tokens, "mask": np.ones((corpus.num_sequences,), np.float32),
            "topk_ids": ids, "topk_logits": logits}


def restriction_cost(corpus: TopKCorpus, restriction: VocabRestriction) -> dict[str, float]:
    """What the vocabulary restriction costs on a corpus (means over real target positions).

    Returns:
      unk_rate: share of target tokens (text tokens and EOS; not BOS) mapped to UNK.
      topk_mass: teacher probability (full vocabulary) on its top-k — the cost of k itself.
      lost_mass: teacher probability (full vocabulary) on dropped top-k ids.
      lost_topk_share: share of the top-k softmax on dropped ids (what renormalisation removes).
      no_teacher_rate: share of positions whose whole top-k was dropped (no KD signal there).
      student_vocab_size, num_kept.
    """
    pos = corpus.position_mask()
    targets = corpus.token_ids[:, 1:]
    unk = restriction.to_student(targets) == UNK_ID
    logits = corpus.topk_logits.astype(np.float64)
    p_full = np.exp(logits - corpus.logsumexp.astype(np.float64)[..., None])
    p_topk = np.exp(logits - logits.max(-1, keepdims=True))
    p_topk /= p_topk.sum(-1, keepdims=True)
    dropped = restriction.to_student(corpus.topk_ids) == UNK_ID
    n = max(int(pos.sum()), 1)
    return {
        "unk_rate": float(unk[pos].sum() / n),
        "topk_mass": float(p_full.sum(-1)[pos].sum() / n),
        "lost_mass": float((p_full * dropped).sum(-1)[pos].sum() / n),
        "lost_topk_share": float((p_topk * dropped).sum(-1)[pos].sum() / n),
        "no_teacher_rate": float(dropped.all(-1)[pos].sum() / n),
        "student_vocab_size": restriction.student_vocab_size,
        "num_kept": int(len(restriction.kept_teacher_ids)),
    }


# ----------------------------------------------------------------------------------------------
# (c) The loss L_pub = L_LM + β·CE(z_S/t, z_T/t)
# ----------------------------------------------------------------------------------------------


def sparse_teacher_probs(topk_logits: jax.Array, temperature: float) -> jax.Array:
    """softmax(z_T/t) over the top-k axis, -inf entries excluded; all-(-inf) rows -> zeros.

    Args:
      topk_logits: float[..., k]. Returns float32[..., k].
    """
    z = topk_logits.astype(jnp.float32) / temperature
    ok = jnp.isfinite(z)
    m = jnp.max(jnp.where(ok, z, -jnp.inf), axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(ok, jnp.exp(z - m), 0.0)
    s = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(s > 0, s, 1.0)


def kd_cross_entropy(student_logits: jax.Array, topk_ids: jax.Array, topk_logits: jax.Array,
                     temperature: float) -> jax.Array:
    """Per-position CE(z_S/t, z_T/t) against the sparse top-k teacher.

    Args:
      student_logits: float[B, L, V]. topk_ids: int[B, L, k] (student ids). topk_logits:
        float[B, L, k] (-inf = dropped).
    Returns:
      float32[B, L]: −Σ_j p_T(j) log_softmax(z_S/t)_j (0 where the teacher has no mass).
    """
    logq = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    gathered = jnp.take_along_axis(logq, topk_ids.astype(jnp.int32), axis=-1)
    p = sparse_teacher_probs(topk_logits, temperature)
    return -jnp.sum(jnp.where(p > 0, p * gathered, 0.0), axis=-1)


def make_distill_loss(apply: Callable[..., jax.Array], *, beta: float, temperature: float,
                      pass_rng: bool = False) -> Callable:
    """The public-training loss ``L_pub = L_LM + β·L_KD`` in the engine's loss contract.

    Args:
      apply: the student, ``apply(params, tokens_in int32[B, L]) -> logits float32[B, L, V]``
        (e.g. ``LMTask.apply``); with ``pass_rng`` it is called as
        ``apply(params, tokens_in, rng=rng)`` (dropout).
      beta: β (App. B.3 grid: 1e-1, 1e-2, 1e-3); β=0 is plain LM training.
      temperature: t (App. B.3: 1).

    Returns:
      ``loss_fn(params, batch, rng) -> (loss, aux)`` with ``batch`` = {'tokens': int32[B, L+1],
      'mask': float32[B], 'topk_ids': int32[B, L, k], 'topk_logits': float32[B, L, k]}
      (optionally 'weight': float32[B], scaling both terms). ``loss = (loss_sum + β·kd_sum) /
      max(num_tokens, 1)``; ``aux`` holds the sums of `fedpriv.models.metrics.lm_sums`
      (``loss_sum`` = LM negative log-likelihood sum, so perplexity stays comparable across
      students; ``num_tokens``, ``num_correct``, ``num_acc_tokens``, ``num_examples``) plus
      ``kd_sum`` = Σ L_KD over the same non-PAD targets.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")

    def loss_fn(params, batch: Mapping[str, jax.Array], rng: jax.Array):
        tokens = batch["tokens"]
        inputs, targets = metrics.split_tokens(tokens)
        logits = apply(params, inputs, rng=rng) if pass_rng else apply(params, inputs)
        weight = batch.get("weight")
        sums = metrics.lm_sums(logits, targets, batch.get("mask"), weight)
        ex = batch.get("mask")
        ex = jnp.ones((tokens.shape[0],), jnp.float32) if ex is None else ex.astype(jnp.float32)
        w_tok = (targets != PAD_ID).astype(jnp.float32) * ex[:, None]
        if weight is not None:
            w_tok = w_tok * weight.astype(jnp.float32)[:, None]
        kd = kd_cross_entropy(logits, batch["topk_ids"], batch["topk_logits"], temperature)
        sums["kd_sum"] = jnp.sum(jnp.where(w_tok > 0, kd * w_tok, 0.0))
        loss = (sums["loss_sum"] + beta * sums["kd_sum"]) / jnp.maximum(sums["num_tokens"], 1.0)
        return loss, sums

    return loss_fn


def describe_corpus(corpus: TopKCorpus) -> dict[str, Any]:
    """Size figures: sequences, k, L, bytes on disk and bytes per 1K sequences."""
    nbytes = corpus.nbytes()
    return {"num_sequences": corpus.num_sequences, "k": corpus.k, "seq_len": corpus.seq_len,
            "logits_dtype": corpus.manifest["logits_dtype"], "bytes": nbytes,
            "bytes_per_1k_sequences": 1000.0 * nbytes / max(corpus.num_sequences, 1)}
