"""Population expansion for private FL of LMs (Koga et al. 2023, population_expansion_koga2023.md).

A target domain T with a small population is trained together with a larger source domain S.
Modules by concern:

- `data`: the S u T `DomainDataset` (per-example domain ids, per-client populations, alpha,
  stratified 6:2:2 split) and the App. A preprocessing (`encode_domain_dataset`).
- `unigrams`: the (eps0, 0)-DP unigram frequencies per population (Sec. 3.2, 4.2; Geometric
  mechanism, charged to the ledger before any data is read).
- `weights`: unigram sequence densities and the relative importance weights of Eq. 3.
- `schemes`: the mechanics of a row of Table 1 (`TrainingScheme`, `Stage`); the eight rows
  themselves are data in ``configs/population_expansion.py``.
- `latency`: the latency model of Prop. 3.1 (Eq. 1, App. B) and its Monte Carlo simulator.
- `datasets`: the CPU-sized domain-adaptation datasets of the reproduction (Sec. 4.1) and the
  large-target variant ``chat_target``; `check_cohorts` refuses a cohort above its population.
- `pipeline`: one scheme on one dataset and seed (unigram release -> PT -> FT through
  `fedpriv.fl.stages.run_stages` with one ledger).
- `tables`: Table 1 rows, notes and chart series from the runs' summaries.
- `regime`: when the private target unigrams carry signal (TV of the release vs TV(u_T,
  u_{S u T})) as N_T, eps0, the vocabulary and the per-user bound vary (experiments/iw_regime).
"""
from fedpriv.expansion.data import (
                                    KOGA_MAX_TOKENS_PER_CLIENT,
                                    KOGA_SEQ_LEN,
                                    POPULATION_LABELS,
                                    SOURCE,
                                    TARGET,
                                    DomainDataset,
                                    assemble_domain_dataset,
                                    chunk_sentence,
                                    encode_domain_dataset,
                                    select_clients,
                                    split_clients,
)
from fedpriv.expansion.datasets import (
                                    DATASET_INFO,
                                    FOLIO_COMEDIES,
                                    FOLIO_HISTORIES,
                                    FOLIO_TRAGEDIES,
                                    PRIVATE_VOCABULARY,
                                    Prepared,
                                    balance_populations,
                                    build_vocabulary,
                                    check_cohorts,
                                    load_domains,
                                    prepare_dataset,
)
from fedpriv.expansion.latency import (
                                    LatencyEstimate,
                                    compare_latency,
                                    expected_kth_arrival,
                                    expected_latency,
                                    latency_counts,
                                    latency_lower_bound,
                                    latency_upper_bound,
                                    latency_upper_bound_tight,
                                    simulate_kth_arrival,
                                    simulate_latency,
)
from fedpriv.expansion.pipeline import (
                                    UNIGRAM_STAGE,
                                    StagePlan,
                                    build_task,
                                    calibrate_stage,
                                    executed_by_population,
                                    outputs,
                                    plan_stages,
                                    run_scheme,
                                    stage_clients,
                                    unigram_diagnostics,
)
from fedpriv.expansion.schemes import PlannedSpend, Stage, TrainingScheme, schemes_markdown
from fedpriv.expansion.unigrams import (
                                    DEFAULT_IGNORE_IDS,
                                    UNIGRAM_ENTRY,
                                    UNIGRAM_MAX_SEQUENCES,
                                    UNIGRAM_MAX_TOKENS_PER_SEQUENCE,
                                    bounded_user_counts,
                                    domain_unigram_frequencies,
                                    normalise_counts,
                                    private_unigram_frequencies,
                                    unigram_counts,
                                    unigram_entry_name,
                                    unigram_sensitivity,
)
from fedpriv.expansion.weights import (
                                    add_importance_weights,
                                    bound_weights,
                                    importance_weights,
                                    relative_log_weights,
                                    sequence_log_density,
)

__all__ = [
    # data
    "SOURCE", "TARGET", "POPULATION_LABELS", "DomainDataset", "assemble_domain_dataset",
    "encode_domain_dataset", "chunk_sentence", "KOGA_SEQ_LEN", "KOGA_MAX_TOKENS_PER_CLIENT",
    "split_clients", "select_clients",
    # unigrams
    "DEFAULT_IGNORE_IDS", "UNIGRAM_MAX_SEQUENCES", "UNIGRAM_MAX_TOKENS_PER_SEQUENCE",
    "UNIGRAM_ENTRY", "unigram_entry_name", "unigram_sensitivity", "bounded_user_counts",
    "unigram_counts", "normalise_counts", "private_unigram_frequencies",
    "domain_unigram_frequencies",
    # weights
    "sequence_log_density", "relative_log_weights", "importance_weights", "bound_weights",
    "add_importance_weights",
    # schemes
    "Stage", "TrainingScheme", "PlannedSpend", "schemes_markdown",
    # latency
    "latency_counts", "expected_kth_arrival", "expected_latency", "latency_lower_bound",
    "latency_upper_bound", "latency_upper_bound_tight", "LatencyEstimate", "simulate_kth_arrival",
    "simulate_latency", "compare_latency",
    # datasets and pipeline
    "FOLIO_COMEDIES", "FOLIO_HISTORIES", "FOLIO_TRAGEDIES", "DATASET_INFO", "Prepared",
    "PRIVATE_VOCABULARY", "build_vocabulary", "balance_populations", "load_domains",
    "check_cohorts", "prepare_dataset",
    "UNIGRAM_STAGE", "StagePlan", "build_task", "calibrate_stage",
    "stage_clients", "plan_stages", "unigram_diagnostics", "run_scheme",
    "executed_by_population", "outputs",
]
