"""Every experiment config: scales, typed overrides, clear errors."""
import pytest

from experiments import common


@pytest.mark.parametrize("path", ["configs/lm_fl.py", "configs/demo.py", "configs/population_expansion.py",
                                  "configs/public_training.py", "configs/fred_pipeline.py",
                                  "configs/fred_table.py", "configs/latency_figure.py",
                                  "configs/privacy_utility.py"])
@pytest.mark.parametrize("scale", ["smoke", "small", "paper"])
def test_every_scale_loads(path, scale):
    assert common.load_config(f"{path}:{scale}") is not None


def test_typed_overrides_and_errors():
    cfg = common.load_config("configs/lm_fl.py:small,rounds=7,split=0.5/0.25/0.25,noise_cohort_size=None,"
                             "target_epsilon=2,noise_multiplier=1.5,tokenizer=word")
    assert cfg.rounds == 7 and cfg.split == (0.5, 0.25, 0.25) and cfg.noise_cohort_size is None
    assert cfg.target_epsilon == 2.0 and cfg.noise_multiplier == 1.5 and cfg.tokenizer == "word"
    pe = common.load_config("configs/population_expansion.py:smoke,seeds=0/1/2,datasets=topics")
    assert pe.seeds == (0, 1, 2) and pe.datasets == ("topics",)
    fp = common.load_config("configs/fred_pipeline.py:smoke,compare_all=true,pca_dims=None,total_epsilon=5")
    assert fp.compare_all is True and fp.pca_dims is None and fp.lm.target_epsilon == 5.0
    with pytest.raises(ValueError, match="unknown config field"):
        common.load_config("configs/lm_fl.py:small,roundz=3")
    with pytest.raises(ValueError, match="unknown scale"):
        common.load_config("configs/lm_fl.py:huge")
    with pytest.raises(FileNotFoundError):
        common.load_config("configs/nope.py:small")
