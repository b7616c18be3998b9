"""The public-LLM-as-the-on-device-model comparison (issue 53): its smoke run end to end -- every
private arm's ledger holds exactly its plan's charge (the same event for every arm, so the same
epsilon), the zero-shot arm charges nothing -- finished arms are read back, a workdir never mixes
configs; the small LM reads the test set aligned with the LLM's; the closed-form client FLOPs
equal XLA's count; the config refuses what would make the comparison unequal."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.llm_lora import privacy_plan
from experiments import common, llm_lora
from fedpriv.data.errors import ConfigError
from fedpriv.dp.plan import account
from fedpriv.models import gguf, llama, lora as L, metrics as M
from fedpriv.models.lm import LMConfig, make_lm, make_lm_task
from fedpriv.public import distill, vocab
from fedpriv.recipes import llm_lora as R

SMOKE = "configs/llm_lora.py:smoke"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    wd = str(tmp_path_factory.mktemp("llm_lora"))
    llm_lora.main(["--config", SMOKE, "--workdir", wd])  # the teacher: gguf.cached_teacher (shared)
    return wd


def test_smoke_writes_the_tables_and_every_private_arm_spends_its_plans_event(smoke):
    for f in ("llm_lora.md", "costs.md", "phases.md", "llm_lora_runs.md", "verdicts.json", "summary.json",
              "llm_lora.png"):
        assert os.path.exists(os.path.join(smoke, f)), f
    cfg = common.load_config(SMOKE)
    planned = {a.name.split(" ")[0]: a for a in account(privacy_plan(cfg))}
    assert set(planned) == set(cfg.arms) - {"zero_shot"}
    spent = set()
    for arm in planned:
        sub = os.path.join(smoke, "seed0", f"eps{cfg.lm.epsilons[0]:g}", arm)
        s = json.load(open(os.path.join(sub, "summary.json")))
        entries = [e for e in s["ledger"]["entries"] if not e.get("post_processing")]
        charged = [e for e in entries if e["epsilon_alone"] > 0]
        assert [e["name"] for e in charged] == [f"dp-ftrl ({arm})"] == list(planned[arm].charges)
        assert s["ledger"]["spent_epsilon"] == pytest.approx(planned[arm].epsilon_dp, rel=1e-6)
        spent.add(round(s["ledger"]["spent_epsilon"], 9))
        assert 0 < s["test"]["bits_per_byte"] < 100 and s["val_curve"]
        eps = cfg.lm.epsilons[0]  # each arm runs its own server lr (the LoRA arms' differs from (a)'s)
        assert s["server_lr"] == (cfg.lm.server_lr if arm == "small_lm" else cfg.lora_server_lr(eps))
        assert s["clip_norm"] == (cfg.lm.clip_norm if arm == "small_lm" else cfg.lora_clip(eps))
    assert len(spent) == 1  # equal epsilon: every private arm charged the same event
    zero = json.load(open(os.path.join(smoke, "zero_shot", "summary.json")))
    assert zero["epsilon"] == 0 and "ledger" not in zero
    verdicts = json.load(open(os.path.join(smoke, "verdicts.json")))
    assert any("beats the small LM at equal epsilon (test bits per byte)" in v["claim"] for v in verdicts)
    assert any("equal upload" in v["claim"] and v["status"] == "not run yet" for v in verdicts)  # not a smoke arm
    costs = open(os.path.join(smoke, "costs.md")).read()  # per arm: the client cost and the rounds to target
    assert all(R.ARM_LABELS[a] in costs for a in cfg.arms) and f"rounds to target, eps {eps:g}" in costs


def test_a_rerun_reads_the_finished_arms_back_and_another_config_is_refused(smoke, capsys):
    before = json.load(open(os.path.join(smoke, "summary.json")))["rows"]
    llm_lora.main(["--config", SMOKE, "--workdir", smoke])
    out = capsys.readouterr().out
    assert "rounds:" not in out
    after = json.load(open(os.path.join(smoke, "summary.json")))["rows"]
    assert [r["test_bpb"] for r in after] == [r["test_bpb"] for r in before]
    with pytest.raises(ConfigError, match="another configuration"):
        llm_lora.main(["--config", SMOKE + ",lora_client_lr=0.1", "--workdir", smoke])


def test_the_small_lms_test_set_is_the_llms_aligned_through_its_vocabulary():
    teacher = gguf.cached_teacher()
    full = distill.VocabRestriction.full(teacher)
    restricted = vocab.restriction_from_texts(teacher, ["the cat sat on the mat", "a dog"], 6)
    msgs = ["the cat is on a mat!", "dogs", "naïve 😀 the"]
    enc_full = vocab.RestrictedTeacherTokenizer(teacher, full).encode(msgs)
    enc_small = vocab.RestrictedTeacherTokenizer(teacher, restricted).encode(msgs)
    width = max(map(len, enc_full)) + 2
    tok = np.zeros((3, width), np.int32)
    want = np.zeros((3, width), np.int32)
    for i, (f, s) in enumerate(zip(enc_full, enc_small)):
        tok[i, :len(f) + 2] = [M.BOS, *f, M.EOS]
        want[i, :len(s) + 2] = [M.BOS, *s, M.EOS]
    got = R.to_restricted(tok, full, restricted)
    np.testing.assert_array_equal(got, want)
    assert (got == M.UNK).any() and (got > M.EOS).any()
    log_q = R.unk_log_q(full, restricted, teacher, ["naïve", "dogs dogs"])
    q = np.exp(log_q[np.isfinite(log_q)])
    assert q.sum() == pytest.approx(1.0) and np.all(np.isfinite(M.unk_code_lengths(got, tok, log_q)))


def test_closed_form_client_flops_equal_the_count_on_the_steps_jaxpr_and_xla_undercounts_loops():
    """The client-cost FLOPs: `fedpriv.models.flops.matmul_flops` counts every matmul of the local
    step's jaxpr (a scan body times its length); the closed forms equal it, for the small LMs and
    for LoRA on the top k blocks (cached lower blocks) or on every block. XLA's cost analysis
    counts a loop body once: below the count as soon as the blocks loop more than once."""
    from fedpriv.models.flops import matmul_flops
    opt = optax.sgd(0.1)
    for arch in ("lstm", "transformer"):
        small = LMConfig(vocab_size=300, embed_dim=16, hidden_dim=32, num_heads=4, arch=arch, max_len=8)
        st = make_lm_task(make_lm(small))
        params = st.init(jax.random.key(0))
        b = {"tokens": jnp.full((4, 7), 5, jnp.int32), "mask": jnp.ones((4,), jnp.float32)}
        step = R._client_step(lambda p, bb: st.loss_fn(p, bb, None), opt)
        assert matmul_flops(step, params, opt.init(params), b) == R.small_lm_step_flops(small, 4, 6)
    cfg = llama.LlamaConfig(vocab_size=200, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=48)
    p = llama.init_params(jax.random.key(0), cfg)
    B, T = 3, 5
    for top in (1, 3, None):
        lc = L.LoraConfig(rank=2, targets=("wq", "wv", "w_down"), top_layers=top)
        task = L.make_lora_task(p, cfg, lc)
        batch = {"tokens": jnp.full((B, T + 1), 5, jnp.int32), "mask": jnp.ones((B,), jnp.float32)}
        if top:
            batch["hidden"] = jnp.ones((B, T, cfg.dim))
        ad = task.init(jax.random.key(1))

        def step(fz, a, s, b):
            return R._client_step(lambda aa, bb: task.loss_with(fz, aa, bb), opt)(a, s, b)

        args = (task.frozen, ad, opt.init(ad), batch)
        count = matmul_flops(step, *args)
        assert count == R.lora_step_flops(task.config, lc, B, T), top
        if top == 3:
            cost = jax.jit(step).lower(*args).compile().cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            assert float(cost["flops"]) < 0.8 * count


def test_the_upload_matched_rank_is_the_closest():
    cfg = common.load_config("configs/llm_lora.py:small")
    big = llama.LlamaConfig(vocab_size=49139, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536)
    per_rank = L.num_adapter_params(big, L.LoraConfig(rank=1, targets=cfg.upload_targets, top_layers=cfg.top_layers))
    for target in (707_356, 3 * per_rank + 1, 10):
        r = R.upload_rank(cfg, target, big)
        assert r >= 1 and all(abs(r * per_rank - target) <= abs(k * per_rank - target) for k in range(1, 200))
    lc = R.lora_config(cfg, "lora_upload", 707_356, big)
    assert lc.scaling == pytest.approx(cfg.alpha / cfg.rank) and lc.top_layers == cfg.top_layers


@pytest.mark.parametrize("override,match", [
    ("arms=small_lm/gpt", "distinct names"),
    ("lora_server_lrs=0.1", "one positive server lr per epsilon"),
    ("lora_clip_norms=0.1/1/2", "one positive clip norm per epsilon"),
    ("epsilons=18.71", "one positive server lr per epsilon"),
    ("rows=none", "pretrain_distill_long"),
    ("top_layers=3", "exceeds the teacher"),
    ("targets=wq/embed", "distinct names"),
    ("frozen_dtype=float16", "frozen_dtype must be one of"),
])
def test_the_config_refuses_an_unequal_or_broken_comparison(override, match):
    scale = "smoke" if override.startswith("top_layers") else "small"
    with pytest.raises(ConfigError, match=match):
        common.load_config(f"configs/llm_lora.py:{scale},{override}")
    one = common.load_config("configs/llm_lora.py:small,epsilons=18.71,epsilon_server_lrs=0.5,server_lr=0.5,"
                             "lora_server_lrs=0.5,lora_clip_norms=0.3")
    assert one.lora_server_lr(18.71) == 0.5 and one.lora_clip(18.71) == 0.3
