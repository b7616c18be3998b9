"""The tokenisation bridge between the public teacher LLM and the on-device student (Wang et al.
2023, §4.1: "we align the tokenizer of the on-device LM with the LLM to share the same vocabulary").

Private and public text are both encoded with the teacher's byte-level BPE and mapped through a
`distill.VocabRestriction` (the V most frequent teacher tokens of the *public* pool — building it
from private text would cost privacy, §3.1 — plus PAD/UNK/BOS/EOS) into student ids.
`RestrictedTeacherTokenizer` plugs into `FederatedDataset.from_text`, so private users become
``{'tokens': int32[n, L+1]}`` exactly as with the project's other tokenizers (BOS, ids, EOS if it
fits, PAD). `suggestion_eval_task` evaluates the student as a suggester that never proposes a
special token (with a restricted vocabulary UNK is the most frequent target).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from fedpriv.data.federated import FederatedDataset
from fedpriv.models import llama, lm, metrics
from fedpriv.public import distill


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


def unk_free_loss_task(task):
    """The same LM trained as the paper's full-vocabulary student: UNK targets carry no loss.

    With a restricted vocabulary (`VocabRestriction`, the V most frequent public teacher ids)
    every dropped token becomes UNK, ~20% of chitchat targets at V=3000. Trained on them, a small
    LM's argmax is UNK wherever it is unsure, which counts as wrong under in-vocabulary accuracy
    (`fedpriv.models.metrics`); the paper's student has the teacher's whole vocabulary and never
    meets UNK (Wang et al. 2023, §3.1/§4.1). Here UNK targets are excluded from ``loss_fn``'s
    numerator and denominator exactly as PAD is (the UNK *inputs* are unchanged), so the model
    only learns to rank real tokens and EOS. ``eval_fn`` is unchanged: the evaluation loss still
    counts UNK targets and the accuracy is the same in-vocabulary accuracy. Only ``loss_fn``
    changes: a loss built from ``apply`` (`distill.make_distill_loss`) keeps UNK targets.
    Returns an `LMTask`.
    """
    def loss_fn(params, batch, rng):  # padded or packed batches (`lm.batch_view`)
        inputs, targets, packing, row_mask = lm.batch_view(batch)
        logits = task.apply(params, inputs, batch.get("domain"), rng, **packing)
        targets = jnp.where(targets == metrics.UNK, metrics.PAD, targets)
        sums = lm.view_sums(batch, logits, targets, row_mask, batch.get("weight"))
        return sums["loss_sum"] / jnp.maximum(sums["num_tokens"], 1.0), sums

    return dataclasses.replace(task, loss_fn=loss_fn)


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


def unk_class_size(restriction: distill.VocabRestriction) -> int:
    """Number of teacher ids the student folds into UNK (dropped and control tokens)."""
    return int(np.sum(restriction.teacher_to_student == metrics.UNK))
