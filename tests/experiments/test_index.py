"""The experiments index: every artefact of the three papers is listed; every listed config
builds at every scale it claims; an artefact without a module says so and exits 2."""
import pytest

from experiments import __main__ as index, common
from fedpriv.data.errors import ConfigError
from tests.experiments.test_paper_configs import REFUSED


def test_list_names_every_artefact_with_its_command(capsys):
    index.main(["--list"])
    out = capsys.readouterr().out
    for a in index.ARTEFACTS:
        assert a.name in out
    papers = {a.paper for a in index.ARTEFACTS}
    assert {"Wang et al. 2023", "Hou et al. 2023", "Koga et al. 2023"} <= papers
    assert out.count("python -m experiments.") == sum(index.available(a) for a in index.ARTEFACTS)


@pytest.mark.parametrize("artefact", [a for a in index.ARTEFACTS if index.available(a)],
                         ids=lambda a: a.name)
def test_every_scale_of_every_listed_config_builds(artefact):
    """Every scale builds, except the ``paper`` scales that refuse on the packaged data with the
    one-line reason ``tests/experiments/test_paper_configs.py`` lists (issue 23 item 1)."""
    for scale in artefact.scales:
        spec = f"configs/{artefact.config}.py:{scale}"
        if scale == "paper" and artefact.config in REFUSED:
            with pytest.raises(ConfigError, match=REFUSED[artefact.config]):
                common.load_config(spec)
            continue
        assert common.load_config(spec) is not None


def test_every_artefact_of_the_three_papers_has_a_module():
    missing = [a.name for a in index.ARTEFACTS if not index.available(a)]
    assert not missing, missing
    for prefix, n in (("wang-", 8), ("hou-", 4), ("koga-", 3)):
        assert sum(a.name.startswith(prefix) for a in index.ARTEFACTS) >= n, prefix


def test_missing_artefact_and_bad_scale_exit_2(capsys, monkeypatch):
    gap = index.Artefact("gap", "Someone 2024", "a table without a module", None, None)
    monkeypatch.setattr(index, "ARTEFACTS", index.ARTEFACTS + (gap,))
    with pytest.raises(SystemExit) as e:
        common.cli(index.main, ["gap"])
    assert e.value.code == 2 and "no experiment module yet" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        common.cli(index.main, ["demo", "--scale", "paper"])
    assert e.value.code == 2 and "not 'paper'" in capsys.readouterr().err


def test_every_published_verdict_lands_under_exactly_one_artefact():
    """The page shows a module's verdict under the artefacts whose ``claims`` filter matches it: a
    claim that matches none is silently dropped from the page (Figure 1's "(...; Figure 1)"
    claims once were), one that matches two is shown twice. Checked on the committed summaries
    and on the claims the Figure 1 recipe writes."""
    import glob
    import json
    import os
    import types

    from fedpriv.recipes import tokenizer_study

    def owners(module, claim):
        return [a.name for a in index.ARTEFACTS if a.module == module and a.shows(claim)]
    summaries = glob.glob(os.path.join(os.path.dirname(index.__file__), "results", "summaries", "*.json"))
    assert summaries
    for f in summaries:
        with open(f) as fh:
            d = json.load(fh)
        for v in d["verdicts"]:
            assert len(owners(d["module"].rsplit(".", 1)[-1], v["claim"])) == 1, (f, v["claim"])
    cfg = types.SimpleNamespace(tokenizers=("sentencepiece", "word:5", "word:9"), epsilons=(18.71, 1.77),
                                lm=types.SimpleNamespace(vocab_size=9))
    rows = [{"tokenizer": t, "seed": s, "method": m, "server_lr": 1.0, "val_accuracy": 0.1 + 0.01 * s,
             "val_accuracy_round0": 0.0, "val_token_accuracy": 0.1 + 0.01 * s,
             "val_token_accuracy_with_oov": 0.1 + 0.011 * s}
            for t in cfg.tokenizers for s in (0, 1) for m in ("hi", "lo")]
    claims = [v.claim for v in tokenizer_study.verdicts(cfg, rows, [("FedAvg", {}), ("hi", {}), ("lo", {})])]
    assert len(claims) > 10
    assert all(owners("privacy_utility", c) in (["wang-table1"], ["wang-figure1"]) for c in claims), claims
    assert sum(owners("privacy_utility", c) == ["wang-figure1"] for c in claims) == len(claims) - 3
