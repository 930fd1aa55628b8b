"""One compile per bucket, on the CPU, measured from what reaches the kernel rather than from the engine's own
bookkeeping.

The engine reports `compiles` (bucket keys, new compiles) from keys it records itself, so a test that only reads
that report checks the report against itself. Here a spy on `kernels.block_sparse_attn.block_sparse_attention`
records the shape, dtype and tile of every call: three prompt lengths in one 64-row bucket must reach the kernel
with one specialisation, and the engine's count of new compiles must agree with the spy. The same three prompts
without bucketing are the control: three specialisations, three compiles. If bucketing stopped padding, or the
report stopped matching the calls, this test fails.
"""

from __future__ import annotations

import pytest

import kernels.block_sparse_attn as bsa
from engine.engine import Engine
from engine.tiers import SparseSpec, TierSpec, TierTable

PROMPTS = ["a red circle moves up, slowly.", "a red circle moves up over a black ground",
           "a red circle moves up slowly over a black backdrop"]
SPARSE = SparseSpec(keep_ratio=1.0, dense_first_steps=0, dense_first_blocks=0)


@pytest.fixture(scope="module")
def engine(nano_components):
    table = TierTable.load()
    table.add(TierSpec("sparse-bucketed", "sparse machinery, 64-row buckets", steps=20, bucket=64, sparse=SPARSE))
    table.add(TierSpec("sparse-exact", "sparse machinery, exact lengths", steps=20, bucket=0, sparse=SPARSE))
    return Engine(nano_components, table)


def _run(engine, tier: str, monkeypatch) -> tuple[list[set], list[int], list[int]]:
    """Per prompt: the kernel specialisations the spy saw, the engine's new-compile count, the token count."""
    seen: set = set()
    real = bsa.block_sparse_attention

    def spy(q, k, v, **kwargs):
        seen.add((tuple(q.shape), str(q.dtype), kwargs["tile"]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(bsa, "block_sparse_attention", spy)
    specialisations, news, tokens = [], [], []
    for prompt in PROMPTS:
        seen.clear()
        clip = engine.generate({"prompt": prompt, "seed": 1, "tier": tier, "steps": 1, "short_edge": 32,
                                "aspect_ratio": "1:1"})
        specialisations.append(set(seen))
        news.append(clip.compiles["new_compiles"])
        tokens.append(clip.tokens)
    monkeypatch.undo()
    return specialisations, news, tokens


def test_three_prompt_lengths_in_one_bucket_reach_the_kernel_with_one_specialisation(engine, monkeypatch):
    exact, exact_news, exact_tokens = _run(engine, "sparse-exact", monkeypatch)
    assert len(set(exact_tokens)) == 3, "the prompts must differ in length, or bucketing has nothing to do"
    assert all(len(s) == 1 for s in exact), "one attention shape per request"
    # Control: without buckets every length is its own specialisation, and the engine counts each as a compile.
    assert len(set.union(*exact)) == 3 and exact_news == [1, 1, 1]

    bucketed, news, tokens = _run(engine, "sparse-bucketed", monkeypatch)
    assert tokens == exact_tokens
    assert all(len(s) == 1 for s in bucketed)
    assert len(set.union(*bucketed)) == 1, f"one bucket must reach the kernel as one shape: {bucketed}"
    shape = next(iter(bucketed[0]))[0]
    assert shape[1] % 64 == 0 and shape[1] >= max(tokens)
    assert news == [1, 0, 0], "the engine's compile count must match what reached the kernel"
