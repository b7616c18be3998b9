"""fedpriv.public: public data and a public LLM helping private FL (Wang et al. 2023).

Modules by concern:

- `distill`: the teacher's top-k corpus, the vocabulary restriction, the distillation loss (§4.1);
- `select`: distribution-matching scores and selection (§5.1);
- `pretrain`: central training on public data (§3.2);
- `vocab`: the tokenisation bridge teacher BPE -> restricted student ids (§4.1);
- `pool`: the public pool with the teacher's log p_pub and top-k (Algorithm 1 line 7);
- `algorithm`: DP-FL -> public mid-training -> DP-FL as stages with one ledger (Algorithm 1).

The teacher itself is `fedpriv.models.llama` (model) loaded by `fedpriv.models.gguf`
(`load_teacher`, `cached_teacher`); the Table 2 experiment's recipe is `fedpriv.recipes.public`.
"""
from fedpriv.public.algorithm import (
                                       SELECTIONS,
                                       Algorithm1Result,
                                       PrivateTraining,
                                       PublicTrainingSpec,
                                       algorithm1,
                                       algorithm1_stages,
                                       private_logprob,
                                       private_only,
                                       public_training,
                                       run_until,
                                       select_public,
)
from fedpriv.public.pool import PublicPool, build_public_pool, teacher_sequence_logprob
from fedpriv.public.vocab import (
                                       RestrictedTeacherTokenizer,
                                       encode_teacher,
                                       private_datasets,
                                       restriction_from_texts,
                                       suggestion_eval_task,
                                       unk_class_size,
                                       unk_free_loss_task,
                                       unk_rate,
)

__all__ = ["SELECTIONS", "Algorithm1Result", "PrivateTraining", "PublicTrainingSpec", "algorithm1",
           "algorithm1_stages", "private_logprob", "private_only", "public_training", "run_until",
           "select_public", "PublicPool", "build_public_pool", "teacher_sequence_logprob",
           "RestrictedTeacherTokenizer", "encode_teacher", "private_datasets",
           "restriction_from_texts", "suggestion_eval_task", "unk_class_size", "unk_free_loss_task",
           "unk_rate"]
