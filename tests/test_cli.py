"""``python -m fedpriv privacy ...``: the paper's numbers, JSON output, and error handling."""
import json
import subprocess
import sys

import pytest

from fedpriv.cli import main


def _run(args):
    return subprocess.run([sys.executable, "-m", "fedpriv", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("z, eps", [(8.83, 1.77), (1.13, 18.71)])
def test_dp_ftrl_epsilon_json(z, eps):
    p = _run(["privacy", "dp-ftrl", "--noise-multiplier", str(z), "--rounds", "1600", "--delta", "1e-6", "--json"])
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"mechanism", "epsilon", "delta", "noise_multiplier", "accountant"} <= set(out)
    assert abs(out["epsilon"] - eps) < 0.01 and out["mechanism"] == "dp-ftrl"


def test_epochs_and_fedavg_and_calibration(capsys):
    assert main(["privacy", "dp-ftrl", "--noise-multiplier", "8.83", "--rounds", "1600", "--delta", "1e-6",
                 "--epochs", "4", "--json"]) == 0
    restarted = json.loads(capsys.readouterr().out)
    assert restarted["epsilon"] > 1.78 and restarted["epochs"] == 4
    assert main(["privacy", "dp-fedavg", "--noise-multiplier", "1.0", "--sampling-rate", "0.01",
                 "--rounds", "100", "--delta", "1e-6", "--json"]) == 0
    fed = json.loads(capsys.readouterr().out)
    assert fed["mechanism"] == "dp-fedavg" and fed["epsilon"] > 0
    assert main(["privacy", "calibrate", "dp-ftrl", "--epsilon", "1.77", "--rounds", "1600", "--delta", "1e-6",
                 "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert abs(cal["noise_multiplier"] - 8.83) < 0.05 and cal["epsilon"] <= 1.77
    assert main(["privacy", "calibrate", "dp-fedavg", "--epsilon", "3", "--sampling-rate", "0.05",
                 "--rounds", "50", "--delta", "1e-5", "--accountant", "rdp"]) == 0
    assert "noise multiplier z" in capsys.readouterr().out


@pytest.mark.parametrize("args, msg", [
    (["privacy", "calibrate", "dp-ftrl", "--epsilon", "0", "--rounds", "10", "--delta", "1e-6"], "epsilon"),
    (["privacy", "calibrate", "dp-ftrl", "--epsilon", "-2", "--rounds", "10", "--delta", "1e-6"], "epsilon"),
    (["privacy", "dp-ftrl", "--noise-multiplier", "1", "--rounds", "10", "--delta", "1"], "delta"),
    (["privacy", "dp-ftrl", "--noise-multiplier", "1", "--rounds", "10", "--delta", "0"], "delta"),
    (["privacy", "dp-ftrl", "--noise-multiplier", "1", "--rounds", "0", "--delta", "1e-6"], "rounds"),
    (["privacy", "dp-fedavg", "--noise-multiplier", "1", "--sampling-rate", "0", "--rounds", "5", "--delta", "1e-6"], "sampling rate"),
    (["privacy", "dp-fedavg", "--noise-multiplier", "1", "--sampling-rate", "1.5", "--rounds", "5", "--delta", "1e-6"], "sampling rate"),
    (["privacy", "dp-ftrl", "--noise-multiplier", "abc", "--rounds", "5", "--delta", "1e-6"], "invalid float"),
    (["privacy", "dp-ftrl", "--rounds", "5", "--delta", "1e-6"], "required"),
])
def test_bad_arguments_one_line_exit_2(args, msg):
    p = _run(args)
    assert p.returncode == 2
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], p.stderr
