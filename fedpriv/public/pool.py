"""The public pool of Algorithm 1 (Wang et al. 2023, §4, §5.1, Algorithm 1 line 7).

Every public sentence in corpus form (`distill.prepare_sequences`: teacher BOS + first L tokens +
EOS if it fits), its student tokens, the teacher's per-sequence average token log-probability
``log p_pub(x)`` (`llama.sequence_logprob`, cached on disk) and, for distillation, the teacher's
top-k corpus (`distill.build_topk_corpus`, cached on disk) restricted to the student vocabulary
(`distill.corpus_to_student`). Student and teacher score the same positions: targets 1..len-1
of the same sequence, EOS included.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import time
from typing import Any, Sequence

import numpy as np

from fedpriv.data.cache import try_write
from fedpriv.models import llama, metrics
from fedpriv.public import distill
from fedpriv.public.vocab import encode_teacher

_LOGP_FORMAT = "fedpriv-logp-pub-v1"


@dataclasses.dataclass(frozen=True)
class PublicPool:
    """A public pool ready for Algorithm 1 (N sequences of at most L predicted tokens).

    Attributes:
      texts, sources: N sentences and their source labels.
      teacher_ids: int32[N, L+1] teacher ids in corpus form (BOS, ids, EOS if it fits, padding).
      lengths: int32[N] real tokens in `teacher_ids` (incl. BOS).
      tokens: int32[N, L+1] the same sequences in student ids (BOS ... EOS PAD).
      logp_pub: float32[N] teacher average token log-prob over targets 1..len-1 (Alg. 1 line 7).
      topk_ids, topk_logits: int32/float32[N, L, k] the teacher's top-k restricted to the student
        vocabulary (-inf = no teacher mass), or None when the pool was built without them.
      corpus: the on-disk `distill.TopKCorpus` (or None).
      restriction: the student's `VocabRestriction`.
      info: timings (teacher tokens/s), cache hits, corpus size.
    """

    texts: tuple[str, ...]
    sources: tuple[str, ...]
    teacher_ids: np.ndarray
    lengths: np.ndarray
    tokens: np.ndarray
    logp_pub: np.ndarray
    topk_ids: np.ndarray | None
    topk_logits: np.ndarray | None
    corpus: distill.TopKCorpus | None
    restriction: distill.VocabRestriction
    info: dict

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def has_topk(self) -> bool:
        return self.topk_ids is not None

    def arrays(self, indices: Sequence[int] | np.ndarray, distill_arrays: bool) -> dict[str, np.ndarray]:
        """Training arrays of the rows `indices`: {'tokens'} (+ 'topk_ids', 'topk_logits')."""
        idx = np.asarray(indices, np.int64)
        out = {"tokens": self.tokens[idx]}
        if distill_arrays:
            if not self.has_topk:
                raise ValueError("this pool has no teacher top-k (build it with with_topk=True)")
            out["topk_ids"] = self.topk_ids[idx]
            out["topk_logits"] = self.topk_logits[idx]
        return out


def _logp_key(teacher: llama.Teacher, token_ids: np.ndarray, lengths: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": _LOGP_FORMAT, "teacher": teacher.fingerprint,
                         "shape": list(token_ids.shape)}).encode())
    h.update(np.ascontiguousarray(token_ids, np.int32).tobytes())
    h.update(np.ascontiguousarray(lengths, np.int32).tobytes())
    return h.hexdigest()


def teacher_sequence_logprob(teacher: llama.Teacher, sequences: Sequence[Sequence[int]], *,
                             cache_dir: str | os.PathLike | None, seq_len: int,
                             batch_size: int = 32, progress: bool = True
                             ) -> tuple[np.ndarray, dict]:
    """log p_pub(x) of corpus-form sequences (BOS first), cached on disk: float32[N], info.

    One compiled shape: every batch is padded to [batch_size, L+1] (`llama.sequence_logprob`
    with a single bucket L+1 and ``add_bos=False``: the sequences already carry BOS).
    """
    ids = np.zeros((len(sequences), seq_len + 1), np.int32)
    lengths = np.array([len(s) for s in sequences], np.int32)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = s
    path = None
    if cache_dir is not None:
        path = os.path.join(cache_dir, f"logp-pub-{_logp_key(teacher, ids, lengths)[:16]}.npy")
        if os.path.exists(path):
            info = {}
            if os.path.exists(path[:-4] + ".json"):  # the timing of the pass that built it
                with open(path[:-4] + ".json") as f:
                    info = json.load(f)
            return np.load(path), {**info, "from_cache": True}
    t0 = time.perf_counter()
    logp = llama.sequence_logprob(teacher, [list(s) for s in sequences], batch_size,
                                  add_bos=False, buckets=(seq_len + 1,), progress=progress)
    secs = time.perf_counter() - t0
    padded = -(-len(sequences) // batch_size) * batch_size * (seq_len + 1)
    info = {"from_cache": False, "seconds": secs, "real_tokens": int(lengths.sum()),
            "padded_tokens": int(padded), "real_tokens_per_second": float(lengths.sum() / secs),
            "padded_tokens_per_second": float(padded / secs)}
    if path is not None:  # unique temporary names: concurrent writers never collide; an
        # unwritable cache is bypassed with one warning
        if try_write(pathlib.Path(path), lambda f: np.save(f, logp.astype(np.float32))):
            try_write(pathlib.Path(path[:-4] + ".json"), lambda f: f.write(json.dumps(info).encode()))
    return logp.astype(np.float32), info


def build_public_pool(teacher: llama.Teacher, texts: Sequence[str], sources: Sequence[str],
                      restriction: distill.VocabRestriction, *, seq_len: int = 20, k: int = 10,
                      cache_dir: str | os.PathLike | None = None, with_topk: bool = True,
                      batch_size: int = 32, logits_dtype: str = "float16",
                      progress: bool = True) -> PublicPool:
    """Encode the public pool and run the teacher over it (both passes cached on disk).

    Args:
      texts, sources: N public sentences and their labels.
      restriction: the student vocabulary.
      seq_len: L (App. B.2: 20). k: teacher top-k (App. B.3: 10).
      cache_dir: where the top-k corpus and the log p_pub array are cached (None: top-k cannot
        be built, log-probs are not cached).
      with_topk: also build the distillation corpus (needed for L_pub with β_KD > 0).
    """
    if len(texts) != len(sources) or not len(texts):
        raise ValueError(f"need N > 0 texts with N source labels, got {len(texts)}, {len(sources)}")
    seqs = distill.prepare_sequences(teacher, encode_teacher(teacher, texts), seq_len)
    logp_pub, logp_info = teacher_sequence_logprob(teacher, seqs, cache_dir=cache_dir,
                                                   seq_len=seq_len, batch_size=batch_size,
                                                   progress=progress)
    info: dict[str, Any] = {"num_sequences": len(seqs), "seq_len": seq_len,
                            "teacher_logprob_pass": logp_info}
    ids = np.zeros((len(seqs), seq_len + 1), np.int32)
    lengths = np.array([len(s) for s in seqs], np.int32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    topk_ids = topk_logits = corpus = None
    if with_topk:
        if cache_dir is None:
            raise ValueError("the top-k corpus lives on disk: pass cache_dir")
        t0 = time.perf_counter()
        corpus = distill.build_topk_corpus(teacher, seqs, cache_dir=cache_dir, k=k,
                                           seq_len=seq_len, batch_size=batch_size,
                                           logits_dtype=logits_dtype, progress=progress)
        secs = time.perf_counter() - t0
        student = distill.corpus_to_student(corpus, restriction)
        tokens, topk_ids, topk_logits = (student["tokens"], student["topk_ids"],
                                         student["topk_logits"])
        timing = os.path.join(cache_dir, f"{corpus.path.name}-timing.json")
        if not corpus.from_cache:
            with open(timing, "w") as f:
                json.dump({"seconds": secs, "padded_tokens": int(corpus.token_ids.size),
                           "real_tokens": int(corpus.lengths.sum()),
                           "padded_tokens_per_second": corpus.token_ids.size / secs,
                           "real_tokens_per_second": float(corpus.lengths.sum() / secs)}, f)
        info["topk_pass"] = {"from_cache": corpus.from_cache}
        if os.path.exists(timing):  # the timing of the pass that built the corpus
            with open(timing) as f:
                info["topk_pass"].update(json.load(f))
        info["corpus"] = distill.describe_corpus(corpus)
        info["restriction_cost"] = distill.restriction_cost(corpus, restriction)
    else:  # the same student tokens corpus_to_student would give
        real = np.arange(seq_len + 1)[None, :] < lengths[:, None]
        tokens = np.where(real, restriction.to_student(ids), metrics.PAD).astype(np.int32)
        tokens[:, 0] = metrics.BOS
    return PublicPool(tuple(texts), tuple(sources), ids, lengths, tokens, logp_pub, topk_ids,
                      topk_logits, corpus, restriction, info)
