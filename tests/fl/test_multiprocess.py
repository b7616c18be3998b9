"""The same round loop under ``jax.distributed``: 2 CPU processes x 2 devices over loopback.

Each process builds only its own lanes (``pack_cohort(lane_subset=...)``) and hands them to
``jax.make_array_from_process_local_data``; the result must equal a single-process run.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np

from tests.conftest import xla_flags

SCRIPT = textwrap.dedent("""
    import os, sys, json
    sys.path.insert(0, os.getcwd())
    pid, n, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    import jax
    if n > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n,
                                   process_id=pid)
    import numpy as np, optax
    from fedpriv.dp.ledger import PrivacyLedger
    from fedpriv.fl.aggregate import client_mesh
    from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
    from fedpriv.fl.cohort import pack_cohort
    from fedpriv.fl.loop import train
    from fedpriv.fl.samplers import ShuffledPassSampler
    from tests.fl.helpers import init_params, loss_fn, make_dataset
    data = make_dataset(num_clients=32, seed=5); ids = list(data)
    s = ShuffledPassSampler(32, 8, seed=1)
    alg = dp_ftrl(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=0.5,
                  noise_multiplier=0.5, expected_cohort_size=8, rounds_per_epoch=s.rounds_per_epoch)
    mesh = client_mesh() if n > 1 else None
    res = train(alg, init_params(), data, ids, s, rounds=6, batch_size=4, seed=3, max_steps=8,
                progress=False, mesh=mesh, ledger=PrivacyLedger(1e3, 1e-5))
    local = pack_cohort(data, [ids[i] for i in s.sample(0)], 4, lanes=4, max_steps=8,
                        lane_subset=range(2 * pid, 2 * pid + 2) if n > 1 else None)
    leaves = [np.asarray(x.addressable_data(0)).tolist() for x in jax.tree_util.tree_leaves(res.state.params)]
    print(json.dumps({"devices": jax.device_count(), "processes": jax.process_count(),
                      "local_lanes": int(local.lanes.length.shape[0]), "params": leaves}))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one(tmp_path):
    script = tmp_path / "mp.py"
    script.write_text(SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    port = str(_free_port())
    env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=2"), JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, str(script), str(i), "2", port], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    results = []
    try:
        for p in procs:
            results.append(p.communicate(timeout=300))
    finally:  # never leave a process waiting for its peer
        for q in procs:
            if q.poll() is None:
                q.kill()
    outs = []
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    single = subprocess.run([sys.executable, str(script), "0", "1", "0"], cwd=root, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-3000:]
    one = json.loads(single.stdout.strip().splitlines()[-1])
    for o in outs:
        assert o["devices"] == 4 and o["processes"] == 2
        assert o["local_lanes"] == 2  # each process materialises only its own lanes
        for a, b in zip(o["params"], one["params"]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert one["local_lanes"] == 4
