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
