"""What an LM-FL run reports beyond its training curve: the tokenizer-comparison accuracies
(Wang et al. §3.1, Figure 1), which outputs the ledger covers (the run record), and the
``summary.md`` table.
"""
from __future__ import annotations

import json
import os

import numpy as np

from fedpriv import report
from fedpriv.data import WordTokenizer
from fedpriv.data.tokenizers import UNK_ID, word_ids_to_token_accuracy
from fedpriv.fl.outputs import OUTPUTS
from fedpriv.models.metrics import accuracy_with_oov, evaluate, predict_next

__all__ = ["tokenizer_accuracies", "PRIVATE_VOCABULARY", "outputs", "write_summary_md",
           "previous_wall_clock"]

def tokenizer_accuracies(task, params, tokens: np.ndarray, tokenizer, batch_size: int,
                         sp_tokenizer=None) -> dict:
    """Accuracies that compare tokenizers (Wang et al. §3.1, Figure 1) on ``tokens`` ``int[N, L+1]``.

    ``accuracy_with_oov``: next-token accuracy with OOV (UNK) targets counted (right iff UNK is
    predicted). ``token_accuracy`` / ``token_accuracy_with_oov``: for a word-level ``tokenizer``
    with a SentencePiece ``sp_tokenizer``, the word predictions converted to next-token accuracy
    (each target word weighs as many tokens as SentencePiece splits it into; right iff the word
    is; ``word_ids_to_token_accuracy``); an OOV target's word is unknown after tokenization, so
    in the ``with_oov`` variant it weighs one token. For a subword tokenizer they are its own
    in-vocabulary accuracy and ``accuracy_with_oov``.
    """
    preds = predict_next(task, params, tokens, batch_size)
    with_oov = accuracy_with_oov(tokens, preds)
    out = {"accuracy_with_oov": with_oov}
    if isinstance(tokenizer, WordTokenizer):
        if sp_tokenizer is not None:
            targets = np.asarray(tokens)[:, 1:]
            ta = word_ids_to_token_accuracy(targets, preds, tokenizer, sp_tokenizer)
            unk = targets == UNK_ID
            n_unk, hit_unk = int(unk.sum()), int((unk & (preds == UNK_ID)).sum())
            total = ta.total_tokens + n_unk
            out.update(token_accuracy=ta.accuracy, word_accuracy=ta.word_accuracy,
                       token_accuracy_with_oov=(ta.correct_tokens + hit_unk) / total if total else float("nan"))
    else:
        out.update(token_accuracy=evaluate(task, params, tokens, batch_size)["accuracy"],
                   token_accuracy_with_oov=with_oov)
    return out


PRIVATE_VOCABULARY = "vocabulary (top-k words of the training users)"


def outputs(vocabulary_public: bool = True) -> dict:
    """Which outputs of the run the ledger covers (the run record)."""
    out = {"covered_by_ledger": ["trained model / checkpoints"],
           "not_covered": ["val_*, test_*, most_frequent_token_val_accuracy, eval_* in "
                           "metrics.jsonl (exact evaluation on held-out private users)"],
           "metrics.jsonl": OUTPUTS}
    if not vocabulary_public:
        out["not_covered"].append("the vocabulary (top-k words of the training users: recorded "
                                  "in the ledger as non-private, epsilon = inf)")
    return out


def write_summary_md(s: dict, workdir: str) -> None:
    rows = [{"metric": k, "value": s[k]} for k in
            ("algorithm", "epsilon", "delta", "epsilon_executed_run", *(
                ("epsilon_if_vocabulary_public", "epsilon_executed_run_if_vocabulary_public")
                if "epsilon_if_vocabulary_public" in s else ()), "noise_multiplier", "rounds",
             "cohort_size", "noise_cohort_size", "val_accuracy", "test_accuracy",
             "most_frequent_token_val_accuracy", "num_params", "wall_clock_s", "seed")]
    pn = s.get("paper_noise")
    if pn:  # the paper-noise protocol: both epsilons, each naming its population
        rows[2:2] = [{"metric": "epsilon_simulated (declared population)", "value": pn["epsilon_simulated"]},
                     {"metric": "simulated population", "value": pn["population"]},
                     {"metric": "epsilon_executed (spent on our users, charged)", "value": pn["epsilon_executed"]},
                     {"metric": "our users", "value": pn["our_users"]}]
    rows += [{"metric": k, "value": v} for k, v in s["data"].items()]
    report.write_table(rows, workdir, "summary", ["metric", "value"],
                       title="Private FL of an on-device LM", notes=[s["noise_note"] or "non-private",
                                                                      "unit of privacy: user"])


def previous_wall_clock(workdir: str):
    """``wall_clock_s`` of the summary a previous session wrote in ``workdir`` (None if none)."""
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            return float(json.load(f)["wall_clock_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
