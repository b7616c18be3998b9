"""Public LLM help for private FL, end to end (Wang et al. 2023, §3.2, §4, §5 and Algorithm 1).

Three layers, each reusing the project's pieces (`fedpriv.public.distill`, `.select`,
`.pretrain`, the engine `fedpriv.fl.loop.train`/`replace_params`, `fedpriv.models.metrics`):

**(1) The tokenisation bridge** (§4.1: "we align the tokenizer of the on-device LM with the LLM to
share the same vocabulary"). Private and public text are both encoded with the teacher's
byte-level BPE and mapped through a `distill.VocabRestriction` (the V most frequent teacher
tokens of the *public* pool — building it from private text would cost privacy, §3.1 — plus
PAD/UNK/BOS/EOS) into student ids. `RestrictedTeacherTokenizer` plugs into
`FederatedDataset.from_text`, so private users become ``{'tokens': int32[n, L+1]}`` exactly as
with the project's other tokenizers (BOS, ids, EOS if it fits, PAD).

**(2) The public pool** (`build_public_pool`): every public sentence in corpus form
(`distill.prepare_sequences`: teacher BOS + first L tokens + EOS if it fits), its student
tokens, the teacher's per-sequence average token log-probability ``log p_pub(x)`` (Algorithm 1
line 7; `llama.sequence_logprob`, cached on disk) and, for distillation, the teacher's top-k
corpus (`distill.build_topk_corpus`, cached on disk) restricted to the student vocabulary
(`distill.corpus_to_student`). Student and teacher score the same positions: targets 1..len-1
of the same sequence, EOS included.

**(3) Algorithm 1** (`algorithm1`) with its variants, so one function yields every row of Table 2:

    ① DP-FTRL for T' rounds (the engine's `train(..., stop_after=T')`; the engine spends the
      whole T-round DP-FTRL event in the ledger before round 0);
    ② log p_priv(x) under the round-T' DP checkpoint (`metrics.sequence_logprob`) and
      log p_pub(x) under the teacher, for every public x (with a restricted vocabulary an UNK
      target is a class of teacher tokens: by default p(UNK) is spread uniformly over it, see
      `private_logprob`, so sequences full of dropped words are not preferred);
    ③ scores (1−β)·log p_pub + β·log p_priv (β=0.5: the paper's ĥ; β=1: "w/o p_pub", Table 3);
      keep the top q fraction (`select.distribution_matching_select`);
    ④ public mid-training of the checkpoint on the selected subset with
      L_pub = L_LM + β_KD·CE(z_S/t, z_T/t) (`pretrain.train_central` + `distill.make_distill_loss`),
      swapped into the DP-FTRL checkpoint with `loop.replace_params` — post-processing of a DP
      output, recorded in the ledger at zero cost;
    ⑤ DP-FTRL resumes for rounds T'..T: same round counter, tree-noise state, sampler position
      and ledger (no new privacy event).

Variants through `PublicTrainingSpec`: ``selection="random"`` (mid-training without distribution
matching), ``kd_beta=0`` (public LM loss only), ``t_prime=0`` (public *pre*-training before any
private round, §3.2/§4: on a random q fraction or ``selection="all"``; distribution matching is
impossible there, §5.3). Everything is resumable from the run's workdir.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.data.federated import FederatedDataset
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.loop import (TrainResult, checkpoint_round, fork_run, load_run, replace_params,
                             train)
from fedpriv.models import llama, metrics
from fedpriv.public import distill, pretrain, select

SELECTIONS = ("matching", "random", "all")
SELECTION_FILE = "public_selection.npz"
DONE_FILE = "public_training.json"
_LOGP_FORMAT = "fedpriv-logp-pub-v1"


# ----------------------------------------------------------------------------------------------
# (1) Tokenisation bridge
# ----------------------------------------------------------------------------------------------


_TEACHERS: dict[str, llama.Teacher] = {}


def cached_teacher(path: str | os.PathLike | None = None) -> llama.Teacher:
    """`llama.load_teacher(path)`, loaded once per process (tests and experiments share it)."""
    key = str(path or "")
    if key not in _TEACHERS:
        _TEACHERS[key] = llama.load_teacher(path)
    return _TEACHERS[key]


def encode_teacher(teacher: llama.Teacher, texts: Sequence[str]) -> list[list[int]]:
    """Texts -> teacher BPE ids (no BOS/EOS), batched through the Rust tokenizer."""
    texts = list(texts)
    if teacher.tokenizer is None:
        raise ValueError("this teacher has no tokenizer; pass token ids instead of text")
    return [e.ids for e in teacher.tokenizer.encode_batch(texts, add_special_tokens=False)]


class RestrictedTeacherTokenizer:
    """The student's tokenizer: teacher BPE, then the vocabulary restriction (§4.1, restricted).

    ``encode(texts) -> list of student-id lists`` (no BOS/EOS; dropped teacher tokens -> UNK),
    ``vocab_size`` = 4 + kept ids. It satisfies the tokenizer contract of
    `FederatedDataset.from_text` / `FederatedText.to_dataset`.
    """

    def __init__(self, teacher: llama.Teacher, restriction: distill.VocabRestriction):
        self.teacher = teacher
        self.restriction = restriction
        self.name = f"teacher-bpe-restricted-{len(restriction.kept_teacher_ids)}"

    @property
    def vocab_size(self) -> int:
        return self.restriction.student_vocab_size

    def encode(self, texts: str | Sequence[str]) -> list[list[int]] | list[int]:
        single = isinstance(texts, str)
        ids = encode_teacher(self.teacher, [texts] if single else texts)
        out = [self.restriction.to_student(np.asarray(s, np.int64)).astype(np.int32).tolist()
               if s else [] for s in ids]
        return out[0] if single else out


def suggestion_eval_task(task):
    """The same LM evaluated as a deployed next-token suggester: the argmax is taken over real
    tokens only (PAD/UNK/BOS/EOS logits excluded), so a prediction is always a word piece.

    With a restricted vocabulary the UNK class is the most frequent target (e.g. ~20% of
    chitchat tokens at V=3000 vs 2.4% for the most frequent real token), and an LM that has
    learned it predicts UNK almost everywhere: 0 in-vocabulary accuracy, although its ranking of
    real tokens may be good. The paper's student shares the full teacher vocabulary and never
    meets UNK (§3.1: "no OOV tokens"); this view measures what such a student would suggest.
    Loss and token counts are unchanged (full softmax, UNK targets included); only
    ``num_correct`` differs from ``task.eval_fn``. Returns an `LMTask` (same init/apply/loss).
    """
    def eval_fn(params, batch):
        inputs, targets = metrics.split_tokens(batch["tokens"])
        logits = task.apply(params, inputs, batch.get("domain"))
        sums = metrics.lm_sums(logits, targets, batch.get("mask"))
        special = jnp.arange(logits.shape[-1]) < distill.NUM_SPECIAL
        masked = jnp.where(special, jnp.asarray(-1e9, logits.dtype), logits)
        sums["num_correct"] = metrics.lm_sums(masked, targets, batch.get("mask"))["num_correct"]
        return sums

    return dataclasses.replace(task, eval_fn=eval_fn)


def restriction_from_texts(teacher: llama.Teacher, texts: Sequence[str], num_kept: int
                           ) -> distill.VocabRestriction:
    """Keep the `num_kept` most frequent teacher tokens of `texts` (use public text: free)."""
    return distill.build_vocab_restriction(encode_teacher(teacher, texts), num_kept, teacher)


def private_datasets(text, tokenizer: RestrictedTeacherTokenizer, *,
                     split: Sequence[float] = (0.8, 0.1, 0.1), split_seed: int = 0,
                     seq_len: int = 20, max_examples_per_client: int | None = 256,
                     batch_size: int = 16, seed: int | None = 0
                     ) -> tuple[FederatedDataset, ...]:
    """Split federated text by client, then tokenize each part with the student tokenizer.

    Returns one `FederatedDataset` of ``{'tokens': int32[n_c, L+1]}`` per split fraction.
    """
    parts = text.split_by_client(tuple(split), seed=split_seed)
    return tuple(p.to_dataset(tokenizer, seq_len=seq_len,
                              max_examples_per_client=max_examples_per_client,
                              batch_size=batch_size, seed=seed) for p in parts)


def unk_rate(tokens: np.ndarray) -> float:
    """Share of real targets (not PAD/BOS) that are UNK in ``int[N, L+1]`` student tokens."""
    t = np.asarray(tokens)[:, 1:]
    real = (t != metrics.PAD) & (t != metrics.BOS)
    return float(((t == metrics.UNK) & real).sum() / max(int(real.sum()), 1))


# ----------------------------------------------------------------------------------------------
# (2) The public pool
# ----------------------------------------------------------------------------------------------


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
    if path is not None:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = path + ".tmp.npy"
        np.save(tmp, logp.astype(np.float32))
        os.replace(tmp, path)
        with open(path[:-4] + ".json", "w") as f:
            json.dump(info, f)
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


# ----------------------------------------------------------------------------------------------
# Selection and central public training
# ----------------------------------------------------------------------------------------------


def unk_class_size(restriction: distill.VocabRestriction) -> int:
    """Number of teacher ids the student folds into UNK (dropped and control tokens)."""
    return int(np.sum(restriction.teacher_to_student == metrics.UNK))


def private_logprob(task, params, pool: PublicPool, batch_size: int = 256, *,
                    unk_correction: bool = True) -> np.ndarray:
    """log p_priv(x): average token log-prob of every pool sequence under the on-device LM
    (Algorithm 1 line 6; `metrics.sequence_logprob`): float32[N].

    With the vocabulary restriction, an UNK target is a *class* of teacher tokens, not a
    token, so the raw average rewards sequences full of out-of-vocabulary words (a model that
    learned to predict UNK scores them high). ``unk_correction`` (default) spreads p(UNK)
    uniformly over the U teacher ids mapped to UNK, making p_priv a distribution over teacher
    token sequences like the paper's full-vocabulary student:

        log p_priv(x) = (1/|T|) Σ_t log p(y_t)  −  (#UNK targets / |T|) · log U.

    (Without restriction, U = #control ids and the correction is negligible.)
    """
    lp = metrics.sequence_logprob(task, params, pool.tokens, batch_size)
    if not unk_correction:
        return lp
    targets = pool.tokens[:, 1:]
    n = np.maximum((targets != metrics.PAD).sum(1), 1)
    n_unk = (targets == metrics.UNK).sum(1)
    u = max(unk_class_size(pool.restriction), 1)
    return (lp - n_unk / n * np.log(u)).astype(np.float32)


def select_public(num: int, q: float, *, selection: str, seed: int = 0,
                  logp_priv: np.ndarray | None = None, logp_pub: np.ndarray | None = None,
                  beta: float = 0.5) -> np.ndarray:
    """Indices of the public subset D' (|D'| = ⌈q·N⌉; ``all``: every index), int64.

    ``matching``: top-q by (1−β)·logp_pub + β·logp_priv (Algorithm 1 lines 10–11);
    ``random``: a uniform q fraction drawn with ``np.random.default_rng(seed)`` (§4, "randomly
    sampled"); ``all``: the whole pool (§3.2).
    """
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if selection == "all":
        return np.arange(num, dtype=np.int64)
    m = select.num_selected(num, q)
    if selection == "random":
        return np.sort(np.random.default_rng(seed).choice(num, m, replace=False)).astype(np.int64)
    if logp_priv is None or logp_pub is None:
        raise ValueError("distribution matching needs logp_priv and logp_pub")
    return select.distribution_matching_select(logp_priv, logp_pub, q, beta)


def public_training(task, params, pool: PublicPool, indices: Sequence[int], *, kd_beta: float,
                    temperature: float = 1.0, steps: int, batch_size: int, seed: int,
                    learning_rate: float = 1e-3, clip: float | None = 1.0,
                    workdir: str | None = None, progress: bool = True,
                    desc: str = "public training"):
    """Central training of the student on pool rows `indices` (§3.2 / §4; App. B.2–B.3).

    ``kd_beta > 0``: L_pub = L_LM + β·CE(z_S/t, z_T/t) against the teacher's top-k
    (`distill.make_distill_loss`); ``kd_beta == 0``: the plain LM loss (`task.loss_fn`).
    Adam with gradient clipping (`pretrain.adam_with_clipping`), resumable from `workdir`.

    Returns:
      ``(params, history)`` of `pretrain.train_central`.
    """
    use_kd = kd_beta > 0
    loss_fn = (distill.make_distill_loss(task.apply, beta=kd_beta, temperature=temperature)
               if use_kd else task.loss_fn)
    return pretrain.train_central(loss_fn, params, pool.arrays(indices, use_kd), steps=steps,
                                  batch_size=batch_size, seed=seed,
                                  optimizer=pretrain.adam_with_clipping(learning_rate, clip),
                                  workdir=workdir, progress=progress, desc=desc)


# ----------------------------------------------------------------------------------------------
# (3) Algorithm 1
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PrivateTraining:
    """One DP-FTRL run of ``rounds`` = T rounds, as arguments of the engine's `train`.

    The engine derives and spends the event of all T rounds before round 0, whatever T'.
    ``stage`` names the run (ledger entry, key tag); ``fingerprint``: extra config fields a
    resumed run must match.
    """

    algorithm: Any
    sampler: Any
    dataset: Mapping
    client_ids: Sequence[str]
    rounds: int
    batch_size: int
    seed: int
    max_steps: int | None = None
    eval_fn: Callable | None = None
    eval_every: int = 0
    checkpoint_every: int = 0
    stage: str = "dp-ftrl"
    fingerprint: Mapping | None = None
    progress: bool = True
    log_fn: Callable[[dict], None] | None = None
    lanes: str | int = "auto"

    def run(self, init_params, workdir: str, ledger: PrivacyLedger | None = None,
            stop_after: int | None = None) -> TrainResult:
        """`train` this run from `init_params` (or resume `workdir`), optionally stopping."""
        return train(self.algorithm, init_params, self.dataset, list(self.client_ids),
                     self.sampler, rounds=self.rounds, batch_size=self.batch_size,
                     seed=self.seed, workdir=workdir, max_steps=self.max_steps,
                     eval_fn=self.eval_fn, eval_every=self.eval_every,
                     checkpoint_every=self.checkpoint_every, ledger=ledger, stage=self.stage,
                     fingerprint=self.fingerprint, progress=self.progress, stop_after=stop_after,
                     log_fn=self.log_fn, lanes=self.lanes)

    def template(self, init_params):
        """A server state with the structure of this run's checkpoints."""
        return self.algorithm.init(init_params, jax.random.key(self.seed))


def _ledger_names(workdir: str) -> list[str]:
    run = load_run(workdir)
    return [e.name for e in run.ledger.entries] if run is not None and run.ledger else []


def run_until(private: PrivateTraining, init_params, workdir: str, round_: int,
              ledger: PrivacyLedger | None = None) -> int:
    """Run (or resume) `private` in `workdir` until its checkpoint is at round `round_`.

    Returns the round reached; raises if the checkpoint is already past `round_`.
    """
    r = checkpoint_round(workdir) or 0
    if r > round_:
        raise ValueError(f"{workdir} is at round {r} > {round_}")
    if r < round_:
        private.run(init_params, workdir, ledger, stop_after=round_ - r)
    return checkpoint_round(workdir) or 0


def fork_checkpoint(src: str, dst: str) -> None:
    """Start `dst` as a branch of the engine run in `src` (`loop.fork_run`: checkpoint incl.
    ledger, metrics). A branch continues exactly as the source would, so the shared first stage
    of several Algorithm-1 variants, and of the run without public training, is computed once.
    """
    fork_run(src, dst)


@dataclasses.dataclass(frozen=True)
class PublicTrainingSpec:
    """How Algorithm 1 uses the public pool.

    Attributes:
      t_prime: T' (0 = public pre-training before any private round; paper: T/2).
      q: fraction of the pool used for public training (paper: 0.08% mid-training, 1% pre-training).
      selection: "matching" (top-q by score_β, needs T' > 0), "random" or "all".
      beta: distribution-matching weight on log p_priv (0.5 = ĥ; 1 = "w/o p_pub").
      kd_beta: β of L_pub = L_LM + β·L_KD (App. B.3 grid {1e-1, 1e-2, 1e-3}; 0 = LM loss only).
      temperature: t (App. B.3: 1).
      steps, batch_size, learning_rate, clip: central training (App. B.2: Adam, lr 1e-3).
      seed: random selection and minibatch order.
      score_batch_size: batch for log p_priv.
      unk_correction: spread p(UNK) over the teacher ids folded into UNK (`private_logprob`).
    """

    t_prime: int
    q: float = 0.01
    selection: str = "matching"
    beta: float = 0.5
    kd_beta: float = 0.1
    temperature: float = 1.0
    steps: int = 100
    batch_size: int = 32
    learning_rate: float = 1e-3
    clip: float | None = 1.0
    seed: int = 0
    score_batch_size: int = 256
    unk_correction: bool = True

    def __post_init__(self):
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.t_prime < 0:
            raise ValueError(f"t_prime must be >= 0, got {self.t_prime}")
        if self.selection == "matching" and self.t_prime == 0:
            raise ValueError("distribution matching needs a private model: T' > 0 (at T' = 0 only "
                             "random or all public data can be used, Wang et al. §5.3)")
        if self.kd_beta < 0 or self.steps < 0:
            raise ValueError("kd_beta and steps must be >= 0")

    @property
    def phase(self) -> str:
        return "mid-training" if self.t_prime > 0 else "pre-training"


@dataclasses.dataclass
class Algorithm1Result:
    """The outcome of `algorithm1`.

    Attributes:
      result: the engine's `TrainResult` of the final call (state at round T, ledger).
      selected: int64[|D'|] pool indices used for public training.
      logp_priv: float32[N] log p_priv under the round-T' checkpoint (None unless matching).
      scores: float64[N] matching scores (None unless matching).
      shares: `select.source_shares` of the selection.
      public: dict of the public-training record (history ends, round, timings).
    """

    result: TrainResult
    selected: np.ndarray
    logp_priv: np.ndarray | None
    scores: np.ndarray | None
    shares: dict
    public: dict


def _save_selection(workdir, idx, logp_priv, scores):
    tmp = os.path.join(workdir, SELECTION_FILE + ".tmp.npz")
    np.savez(tmp, selected=idx,
             logp_priv=np.zeros(0, np.float32) if logp_priv is None else logp_priv,
             scores=np.zeros(0, np.float64) if scores is None else scores)
    os.replace(tmp, os.path.join(workdir, SELECTION_FILE))


def _load_selection(workdir):
    with np.load(os.path.join(workdir, SELECTION_FILE)) as z:
        lp, sc = z["logp_priv"], z["scores"]
        return z["selected"], (lp if lp.size else None), (sc if sc.size else None)


def algorithm1(private: PrivateTraining, task, init_params, pool: PublicPool,
               spec: PublicTrainingSpec, *, workdir: str, ledger: PrivacyLedger | None = None,
               stage1_workdir: str | None = None, progress: bool = True,
               log: Callable[[str], None] = print) -> Algorithm1Result:
    """Wang et al. 2023, Algorithm 1 (and its T'=0 / random-selection / LM-loss variants).

    Args:
      private: the T-round DP-FTRL run (its privacy event covers all T rounds).
      task: the on-device LM (`LMTask`: apply, loss_fn) whose params the engine trains.
      init_params: the randomly initialised LM (Algorithm 1 line 1).
      pool: the public pool (with top-k arrays if ``spec.kd_beta > 0``).
      spec: T', q, selection, β, L_pub settings.
      workdir: this run's engine workdir (checkpoints, metrics, selection, public training).
      ledger: the pipeline's ledger (the DP-FTRL event is spent into it before round 0; public
        training is recorded as post-processing). On resume the checkpoint's ledger is used.
      stage1_workdir: optional shared directory for rounds 0..T' (same private run and
        init_params): computed once and forked into `workdir` (`fork_checkpoint`).

    Returns:
      `Algorithm1Result`; ``result.state.round == T``.
    """
    T, tp = private.rounds, spec.t_prime
    if not 0 <= tp < T:
        raise ValueError(f"need 0 <= T' < T, got T'={tp}, T={T}")
    os.makedirs(workdir, exist_ok=True)
    done_path = os.path.join(workdir, DONE_FILE)
    note = (f"public {spec.phase} at round {tp} on {spec.selection} q={spec.q:g}"
            + (f" (beta={spec.beta:g})" if spec.selection == "matching" else "")
            + (f" with distillation (beta_kd={spec.kd_beta:g}, t={spec.temperature:g})"
               if spec.kd_beta > 0 else " with LM loss"))
    public_dir = os.path.join(workdir, "public_training")

    def do_public(params):
        logp_priv = scores = None
        if spec.selection == "matching":
            logp_priv = private_logprob(task, params, pool, spec.score_batch_size,
                                        unk_correction=spec.unk_correction)
            scores = select.matching_scores(logp_priv, pool.logp_pub, spec.beta)
        idx = select_public(len(pool), spec.q, selection=spec.selection, seed=spec.seed,
                            logp_priv=logp_priv, logp_pub=pool.logp_pub, beta=spec.beta)
        _save_selection(workdir, idx, logp_priv, scores)
        t0 = time.perf_counter()
        new, hist = public_training(task, params, pool, idx, kd_beta=spec.kd_beta,
                                    temperature=spec.temperature, steps=spec.steps,
                                    batch_size=spec.batch_size, seed=spec.seed,
                                    learning_rate=spec.learning_rate, clip=spec.clip,
                                    workdir=public_dir, progress=progress,
                                    desc=f"public {spec.phase}")
        record = {"note": note, "round": tp, "num_selected": int(len(idx)),
                  "steps": spec.steps, "seconds": time.perf_counter() - t0,
                  "first_loss": hist[0]["loss"] if hist else None,
                  "last_loss": hist[-1]["loss"] if hist else None,
                  "spec": dataclasses.asdict(spec)}
        if private.eval_fn is not None:  # the model handed to (the rest of) DP-FTRL
            record["eval_after_public_training"] = {
                k: float(v) for k, v in private.eval_fn(new).items()}
        return new, record

    if tp == 0:
        if checkpoint_round(workdir) is None:
            params, record = do_public(init_params)
            if ledger is not None:
                ledger.record_post_processing(
                    f"public {spec.phase}",
                    note="public data only, before any private round: no privacy cost")
            with open(done_path, "w") as f:
                json.dump(record, f, indent=1)
        else:
            params = init_params  # the checkpoint holds the state; init only gives structure
        log(f"{note}; DP-FTRL rounds 0..{T}")
        result = private.run(params, workdir, ledger)
    else:
        if not os.path.exists(done_path):
            if checkpoint_round(workdir) is None and stage1_workdir is not None:
                run_until(private, init_params, stage1_workdir, tp, ledger)
                fork_checkpoint(stage1_workdir, workdir)
            reached = run_until(private, init_params, workdir, tp, ledger)
            log(f"stage 1: DP-FTRL rounds 0..{reached} done; {note}")
            record: dict = {}
            if f"public {spec.phase}" not in _ledger_names(workdir):
                def fn(params):
                    new, rec = do_public(params)
                    record.update(rec)
                    return new
                replace_params(workdir, private.template(init_params), fn,
                               ledger_note=f"public {spec.phase}")
            else:  # interrupted after the swap, before the record: rebuild it
                record.update({"note": note, "round": tp, "recovered": True})
            with open(done_path, "w") as f:
                json.dump(record, f, indent=1)
        log(f"stage 2: DP-FTRL rounds {tp}..{T}")
        result = private.run(init_params, workdir, None)
    idx, logp_priv, scores = _load_selection(workdir)
    with open(done_path) as f:
        public = json.load(f)
    return Algorithm1Result(result, idx, logp_priv, scores,
                            select.source_shares(pool.sources, idx), public)
