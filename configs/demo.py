"""The main job (``make demo``): an on-device LSTM trained with DP-FTRL on chitchat.

Same config type as ``configs/lm_fl.py``; the demo is its ``small`` scale (a few minutes on
2 CPU cores) with DP-FTRL at epsilon ~ 18.7 (delta = 1e-6), the looser budget of Wang et al. --
SIMULATED: the epsilon of the noise-cohort simulation (cohort 16 trained, noise of 100, McMahan
et al. 2018: a population of 1,053 x 100 / 16 users); the run on chitchat's 1,053 training users
spends epsilon ~262, reported beside it (``epsilon_executed_run``).
"""
from configs.lm_fl import LMFLConfig, get_config as _get, privacy_plan  # noqa: F401


def get_config(arg: str = "small") -> LMFLConfig:
    return _get(arg or "small")
