"""Wang et al. 2023 Table 2's sample-efficiency claims on the whole public pool, with a student
vocabulary of <= 3 % UNK targets (issue 50): "pre-training with distillation on 1 % of the public
data is at least as good as pre-training on 100 %", "distribution matching on 0.08 % performs as
well as distillation on 1 %", "distribution matching on 0.08 % is comparable to pre-training on the
whole corpus" and "distillation gains more than 7 points over no public training" (§1, §4, §5.3,
abstract), at eps 1.77, LSTM.

wang-table2 (``experiments.public_training`` at its small scale) cannot test them: its pool is
1,024 sentences, so its "1 %" row is the whole pool ("not testable here"), and 20.5 % of its
targets are UNK. This artefact runs the same experiment code on ``configs/wang_pool.py``: all
25,463 packaged sentences, 1 % = 255 and 0.08 % = 20 of them, the teacher's BPE restricted to
26,000 ids (2.96 % UNK targets), central steps in the paper's 1,400 : 100 : 8 proportions. Its
claims carry the prefix ``[whole pool]`` so that they are counted apart from wang-table2's.

    python -m experiments wang-table2-pool --scale small --workdir runs/wang_pool
    python -m experiments.wang_pool --config configs/wang_pool.py:small,seeds=0/1/2 --workdir runs/wang_pool
"""
from __future__ import annotations

import dataclasses
import os

from experiments import common, public_training
from experiments.index import Artefact
from fedpriv import verdicts as V
from fedpriv.recipes import public

__verdict_code__ = ("verdicts", "_in_design", "NEW_HERE", "COUNTED_THERE")  # read-time code (results.verdict_code)

ARTEFACTS = (
    Artefact("wang-table2-pool", "Wang et al. 2023", "Table 2's 1 % vs 100 % and 0.08 % contrasts on the whole "
             "public pool (25,463 sentences) with a <= 3 % UNK student vocabulary (eps 1.77, LSTM)", "wang_pool",
             "wang_pool", outputs=("public_training.md", "public_training.png")),
)

#: the prefix of every claim of this artefact (its rows differ from wang-table2's in pool,
#: vocabulary and central steps: the same claim texts would otherwise be counted twice)
TAG = "[whole pool] "


def _in_design(cfg, v) -> bool:
    """Whether ``v`` is a claim of this design: not one whose rows the config leaves out (then it
    is wang-table2's), nor the Transformer column's placeholder."""
    if v.status != V.NOT_RUN:
        return True
    reason = v.reason or ""
    if reason.startswith("row(s) not in this run: "):
        return set(reason.split(": ", 1)[1].split(", ")) <= set(cfg.rows)
    return "Transformer" not in v.claim


#: the claims only this design can test (wang-table2: "not testable here"); its other claims are
#: wang-table2's too, and count there: here they are the project's checks of the same claim
NEW_HERE = ("pre-training with distillation on 1% of the public data is at least as good",
            "distribution matching on 0.08% performs as well as distillation on 1%")
COUNTED_THERE = " (the paper's claim is counted under wang-table2)"


def verdicts(cfg, runs: list[dict], mft, mft_val=None) -> list:
    """`fedpriv.recipes.public.verdicts` on this design's rows, each claim prefixed with
    :data:`TAG`; the claims of rows it does not run are wang-table2's and left out; a claim that
    wang-table2 also tests (all but :data:`NEW_HERE`) is a project check here, so that no claim
    of the paper counts twice."""
    out = []
    for v in public.verdicts(cfg, runs, mft, mft_val):
        if not _in_design(cfg, v):
            continue
        if any(s in v.claim for s in NEW_HERE):
            # a claim the paper's own numbers contradict is a project check, run or not (public.py's
            # "not run yet" of it keeps the default source)
            source = "project" if "[not the paper's claim here" in v.claim else v.source
            out.append(dataclasses.replace(v, claim=TAG + v.claim, source=source))
        else:
            out.append(dataclasses.replace(v, claim=TAG + v.claim + COUNTED_THERE, source="project"))
    return out


def run(cfg, workdir: str) -> dict:
    """`experiments.public_training.run` (the tables, figures and summary), then this design's
    verdicts in place of wang-table2's."""
    result = public_training.run(cfg, workdir)
    mft = result["most_frequent_token_test_accuracy"]
    common.write_verdicts(verdicts(cfg, result["runs"], mft), workdir)
    return result


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, __doc__, "wang_pool")
    common.run_slices(public_training.train, cfg, workdir, public_training.slices(cfg),
                      narrow=public_training.narrow, prepare=public_training.prepare)
    run(cfg, workdir)
    print(open(os.path.join(workdir, "public_training.md")).read())


if __name__ == "__main__":
    common.cli(main)
