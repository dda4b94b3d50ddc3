"""The global batch a job trains when spec.training.globalBatchTokens is unset: chosen from the model's
size and the sequence length alone (docs/global-batch.md has the rule and its sources)."""

from __future__ import annotations

from dataclasses import dataclass

# (fewer parameters than this, tokens per optimizer step); the last bucket has no upper bound.
# Published recipes grow the batch with the model: GPT-3 (Brown et al. 2020, Table 2.1) trained 125M-760M
# at 0.5M tokens, 1.3B-2.7B at 1M, 6.7B-13B at 2M, 175B at 3.2M; NeMo's AutoConfigurator grid sets 64
# sequences of 8192 (0.5M) up to 1B, 256 of 8192 (2M) up to 8B and 1024 of 4096 (4M) up to 95B; Llama 3's
# 405B started at 4M tokens. Powers of two, so every power-of-two GPU count divides them.
BUCKETS: tuple[tuple[float, int], ...] = (
    (1.5e9, 2**19),
    (5e9, 2**20),
    (20e9, 2**21),
)
LARGEST = 2**22
RULE_DOC = "docs/global-batch.md"
# The rule's name and version, stored with each job it chose for (status.globalBatch.rule): a later
# operator with another rule keeps what this one chose (docs/global-batch.md).
RULE_VERSION = "tokens-by-model-size/1"


@dataclass(frozen=True)
class ChosenBatch:
    """The global batch the rule chose: tokens, whole sequences, and the rule in words."""

    tokens: int
    sequences: int
    reason: str


def target_tokens(parameters: int) -> int:
    """Tokens per step the published recipes use for a model of this size."""
    for below, tokens in BUCKETS:
        if parameters < below:
            return tokens
    return LARGEST


def choose_global_batch(parameters: int, sequence_length: int, data_parallel: int) -> ChosenBatch:
    """The rule's global batch for a model of `parameters` at `sequence_length`, in whole sequences.

    The sequence count is the target tokens over the sequence length, at least one. It does not depend
    on the GPUs except where their data-parallel count does not divide it (a count that is not a power of
    two, or more ranks than sequences): then it is rounded up to the next multiple of `data_parallel`, so
    that every rank trains whole sequences; for the usual 8 GPUs a node on 1, 2, 4, ... nodes that never
    happens and the tokens per step are the same on every count.
    """
    target = target_tokens(parameters)
    sequences = max(1, round(target / sequence_length))
    rounded = -(-sequences // data_parallel) * data_parallel
    why = f"{sequences:,} sequences of {sequence_length} (about {target:,} tokens for a model of "
    why += f"{parameters / 1e9:.2f}B parameters; {RULE_DOC})"
    if rounded != sequences:
        why += f", rounded up to {rounded:,} so that {data_parallel} data-parallel ranks share it evenly"
    return ChosenBatch(rounded * sequence_length, rounded, why)
