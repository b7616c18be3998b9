"""fedpriv.fl: the federated engine — samplers (each knows its own amplified privacy event),
cohort packing into lanes of real client steps, local training, clipped aggregation, DP-FedAvg /
DP-FTRL / FedAvg / FedAdam servers, the one round loop (``train``: accounting, metrics,
atomic resumable checkpoints) and the stage mechanism for multi-stage private pipelines.

    alg = build_algorithm(loss_fn, optax.sgd(0.5), server_optimizer("sgdm", 1.0),
                          DPConfig(clip_norm=1.0, noise_multiplier=1.1, mechanism="tree",
                                   restart_every=sampler.rounds_per_epoch), cohort)
    result = train(alg, params, dataset, client_ids, sampler, rounds=100, batch_size=16,
                   seed=0, ledger=PrivacyLedger(8.0, 1e-6), workdir="runs/x")
"""
from fedpriv.fl.aggregate import WEIGHTINGS, client_mesh, client_weight, packed_sum
from fedpriv.fl.algorithms import (
                                   MECHANISMS,
                                   DDGDPConfig,
                                   DPConfig,
                                   FederatedAlgorithm,
                                   MatrixDPConfig,
                                   ServerState,
                                   build_algorithm,
                                   dp_fedavg,
                                   dp_ftrl,
                                   neighboring_for,
                                   privacy_event,
                                   server_optimizer,
)
from fedpriv.fl.checkpoint import Checkpointer, CheckpointError, ResumeMismatch
from fedpriv.fl.client import (
                                   ClientHooks,
                                   ServerHooks,
                                   ServerView,
                                   default_client,
                                   make_local_step,
                                   optimizer_server,
                                   params_delta,
                                   step_hooks,
                                   value_and_grad,
)
from fedpriv.fl.client_state import ClientStateStore
from fedpriv.fl.cohort import Lanes, PackedCohort, assign_lanes, build_cohort, pack_cohort
from fedpriv.fl.execution import CohortExecutor, balanced_lanes, default_lanes, replicate
from fedpriv.fl.loop import (
                                   DP_COVERED_METRICS,
                                   METRICS,
                                   NONPRIVATE,
                                   OUTPUTS,
                                   PUBLIC_METRICS,
                                   TRAINING_FIELDS,
                                   PrivacyAccountingError,
                                   RunCheckpoint,
                                   TrainResult,
                                   checkpoint_round,
                                   fork_run,
                                   load_run,
                                   read_metrics,
                                   replace_params,
                                   train,
)
from fedpriv.fl.samplers import (
                                   AmplificationError,
                                   AmplifiedCyclicSampler,
                                   CyclicSampler,
                                   PoissonSampler,
                                   ShuffledPassSampler,
                                   UniformSampler,
                                   amplified_banded_event,
                                   matrix_privacy_event,
)
from fedpriv.fl.stages import PipelineResult, Stage, StageContext, run_stages

__all__ = [
    "WEIGHTINGS", "client_mesh", "client_weight", "packed_sum", "MECHANISMS", "DPConfig",
    "FederatedAlgorithm", "ServerState", "build_algorithm", "dp_fedavg", "dp_ftrl",
    "neighboring_for", "privacy_event", "server_optimizer", "Checkpointer", "CheckpointError",
    "ResumeMismatch", "make_local_step", "Lanes", "PackedCohort", "assign_lanes", "build_cohort",
    "pack_cohort", "CohortExecutor", "balanced_lanes", "default_lanes", "replicate",
    "DP_COVERED_METRICS", "METRICS", "NONPRIVATE", "OUTPUTS", "TRAINING_FIELDS",
    "PrivacyAccountingError", "RunCheckpoint", "TrainResult", "checkpoint_round", "fork_run",
    "load_run", "read_metrics", "replace_params", "train", "PoissonSampler",
    "ShuffledPassSampler", "UniformSampler", "PipelineResult", "Stage", "StageContext",
    "run_stages", "CyclicSampler", "matrix_privacy_event", "MatrixDPConfig",
    "AmplifiedCyclicSampler", "AmplificationError", "amplified_banded_event", "DDGDPConfig",
    "PUBLIC_METRICS", "ClientHooks", "ServerView", "default_client", "ServerHooks",
    "optimizer_server", "params_delta", "step_hooks", "value_and_grad", "ClientStateStore",
]
