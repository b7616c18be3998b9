"""DDG vs central Gaussian: every row runs at the same z on the same fixed-size cohorts; DDG's
event is the secure-sum event (no amplification), the central one amplified; the smoke run
writes its table and verdicts."""
import dataclasses
import json
import os

import dp_accounting as dpa

from experiments import common, ddg_comparison
from fedpriv.dp import ddg
from fedpriv.dp.accounting import compute_epsilon
from fedpriv.fl.samplers import UniformSampler
from fedpriv.recipes import lm
from tests.fl.helpers import loss_fn


def test_rows_share_z_and_cohorts_and_ddg_is_not_amplified():
    cfg = common.load_config("configs/ddg_comparison.py:smoke")
    eps = {}
    for label, alg, bits in ddg_comparison.rows_of(cfg):
        c = dataclasses.replace(cfg.lm, algorithm=alg, ddg_bits=bits)
        algo, sampler, event, z = lm.build_algorithm(c, 1000, loss_fn, num_params=5000)
        assert isinstance(sampler, UniformSampler) and z == cfg.lm.noise_multiplier
        eps[label] = compute_epsilon(event, c.delta, "replace_one")[0]
        if alg == "dp_ddg":
            assert algo.dp.bits == bits and algo.dp.dim == 5000
            assert isinstance(event.event, ddg.DistributedDiscreteGaussianDpEvent)
            assert event.count == c.rounds  # every round, no amplification
        else:
            assert isinstance(event.event, dpa.SampledWithoutReplacementDpEvent)
    assert eps["DDG 8 bits"] > eps["DDG 16 bits"] > eps["central Gaussian"]


def test_smoke_run_writes_the_table_and_verdicts(tmp_path):
    wd = str(tmp_path / "ddg")
    ddg_comparison.main(["--config", "configs/ddg_comparison.py:smoke,bits=8", "--workdir", wd])
    md = open(os.path.join(wd, "ddg_comparison.md")).read()
    assert "| central Gaussian |" in md and "| DDG 8 bits |" in md
    rows = json.load(open(os.path.join(wd, "summary.json")))["rows"]
    assert {r["row"] for r in rows} == {"central Gaussian", "DDG 8 bits"}
    assert all(r["overflow_coords"] == 0 for r in rows)
    assert os.path.exists(os.path.join(wd, "verdicts.json"))
