"""The correlated-noise comparison: every mechanism is calibrated to the same epsilon, and the
matrix mechanisms run on cyclic cohorts whose min-separation their accounting assumes."""
import dataclasses

import pytest

from experiments import common, mf_comparison
from fedpriv.dp.accounting import compute_epsilon
from fedpriv.fl.samplers import CyclicSampler
from fedpriv.recipes import lm
from tests.fl.helpers import loss_fn


@pytest.mark.parametrize("scale", ["smoke"])
def test_every_algorithm_is_calibrated_to_the_same_epsilon(scale):
    cfg = common.load_config(f"configs/mf_comparison.py:{scale}")
    assert len(cfg.algorithms) == 4 and "dp_mf_banded" in cfg.algorithms and "dp_mf_blt" in cfg.algorithms
    eps = {}
    for alg in cfg.algorithms:
        c = dataclasses.replace(cfg.lm, algorithm=alg)
        algo, sampler, event, z = lm.build_algorithm(c, 1000, loss_fn)
        eps[alg] = compute_epsilon(event, c.delta)[0]
        assert eps[alg] <= c.target_epsilon * (1 + 1e-6) and eps[alg] >= 0.97 * c.target_epsilon, (alg, eps)
        if alg.startswith("dp_mf"):
            assert isinstance(sampler, CyclicSampler)
            assert algo.dp.min_separation == sampler.min_separation == 1000 // c.cohort_size
            assert algo.dp.mechanism == mf_comparison.LABELS[alg].split()[-2].lower() or alg == "dp_mf_blt"


def test_aggregate_reports_mean_and_std_per_algorithm():
    rows = [{"algorithm": "DP-FTRL BLT", "seed": s, "epsilon": 18.7, "noise_multiplier": 1.0,
             "val_accuracy": v, "test_accuracy": v, "s_per_round": 1.0} for s, v in ((0, 0.1), (1, 0.2))]
    (row,) = mf_comparison.aggregate(rows)
    assert row["val accuracy (%)"] == "15.00 ± 7.07" and row["seeds"] == 2
