"""The advice when a data set cannot feed one step of the plan names what works (issue 26)."""

from __future__ import annotations

from blackwell_trainer.plan.shard_manifest import too_little_data, windows


def advice(tokens: list[int], seq: int, dp: int, mbs: int, ga: int = 1) -> str:
    found = too_little_data(
        tokens, uri="/fsx/t", sequence_length=seq, data_parallel=dp, micro_batch_size=mbs, accumulation=ga
    )
    assert found is not None
    return found


def test_enough_data_passes_and_the_edge_is_exact() -> None:
    # 16 windows of 129 tokens: exactly 2 ranks x 8, the 17th token of each shard's tail unused.
    tokens = [16 * 128 + 1]
    assert windows(tokens, 128) == 16
    assert too_little_data(tokens, uri="u", sequence_length=128, data_parallel=2, micro_batch_size=8) is None
    assert too_little_data(tokens, uri="u", sequence_length=128, data_parallel=2, micro_batch_size=9)


def test_at_the_shortest_sequence_it_names_the_batch_the_data_and_the_nodes_not_the_sequence() -> None:
    # 29K tokens at the CRD's shortest sequence, micro-batch 256 on 8 ranks: no shorter sequence exists.
    text = advice([29_000], seq=128, dp=8, mbs=256)
    assert "sequenceLength" not in text
    assert "add about" in text and "tokens to /fsx/t" in text
    assert "spec.tuning.microBatchSize: 28 or smaller" in text  # 226 samples // 8 ranks
    assert windows([29_000], 128) // 8 == 28


def test_fewer_ranks_are_named_when_a_micro_batch_per_rank_is_more_than_the_data() -> None:
    text = advice([10 * 128 + 1], seq=128, dp=16, mbs=2)
    assert "at most 5 data-parallel ranks (spec.cluster.nodes)" in text


def test_accumulation_names_the_global_batch() -> None:
    text = advice([100 * 1024 + 1], seq=1024, dp=8, mbs=4, ga=8)
    assert "x 8 accumulation steps = 256 samples" in text
    assert "spec.training.globalBatchTokens (at most 102,400)" in text


def test_a_shorter_sequence_is_named_only_where_it_gives_enough_samples() -> None:
    text = advice([40 * 512 + 1], seq=4096, dp=8, mbs=4)  # 5 windows at 4096; 40 at 512; 80 at 256
    assert "spec.training.sequenceLength: 512" in text
