"""Issue 42: the tests draw the same random numbers on every run and in any order.

conftest.py's autouse `seeded_global_rngs` resets torch's, numpy's and `random`'s global generators before every test;
the tests and their helpers take their own generators with explicit seeds. Both are checked here.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import GLOBAL_SEED

TESTS = Path(__file__).resolve().parent


def _fresh_draws() -> dict[str, list[float]]:
    """What the global generators give right after a reset to GLOBAL_SEED, from generators of their own."""
    return {"torch": torch.rand(4, generator=torch.Generator().manual_seed(GLOBAL_SEED)).tolist(),
            "numpy": np.random.RandomState(GLOBAL_SEED).random_sample(4).tolist(),
            "random": [random.Random(GLOBAL_SEED).random()]}


@pytest.mark.parametrize("turn", ["first", "second"])
def test_every_test_starts_from_the_same_global_generator_state(turn):
    got = {"torch": torch.rand(4).tolist(), "numpy": np.random.random_sample(4).tolist(), "random": [random.random()]}
    assert got == _fresh_draws(), f"{turn}: the global generators were not reset before this test"
    # Leave them somewhere else: the other turn (whichever runs later) must still start from GLOBAL_SEED.
    torch.manual_seed(12345)
    torch.rand(100)
    np.random.seed(12345)
    random.seed(12345)


# Constructors that, called with no argument, seed themselves from OS entropy (or, torch.Generator, from a fixed
# default nobody chose): a test must name its seed.
UNSEEDED_CONSTRUCTORS = {"default_rng", "RandomState", "Random", "SeedSequence"}


def unseeded_generators(source: str) -> list[tuple[int, str]]:
    """(line, call) of each generator made without a seed: `np.random.default_rng()`, `RandomState()`,
    `random.Random()`, `SeedSequence()` with no argument, or a `torch.Generator(...)` without `.manual_seed(...)`."""
    tree = ast.parse(source)
    seeded_torch = {id(node.func.value) for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "manual_seed"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        no_seed = not node.args and not any(kw.arg in ("seed", "x") for kw in node.keywords)
        if name in UNSEEDED_CONSTRUCTORS and no_seed:
            found.append((node.lineno, ast.unparse(node)))
        elif name == "Generator" and ast.unparse(func).startswith("torch.") and id(node) not in seeded_torch:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_scan_finds_unseeded_generators():
    bad = ("import random\nimport numpy as np\nimport torch\n"
           "a = np.random.default_rng()\nb = random.Random()\nc = torch.Generator()\nd = np.random.RandomState()\n"
           "e = np.random.default_rng(3)\nf = random.Random(4)\ng = torch.Generator().manual_seed(5)\n"
           "h = torch.Generator(device='cpu').manual_seed(6)\n")
    assert [line for line, _ in unseeded_generators(bad)] == [4, 5, 6, 7]


def test_no_test_makes_an_unseeded_generator():
    offenders = {path.name: found for path in sorted(TESTS.glob("*.py"))
                 if (found := unseeded_generators(path.read_text()))}
    assert offenders == {}, f"give these generators a seed: {offenders}"
