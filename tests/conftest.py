"""Shared fixtures: the embedded nano engine, loaded once per test session, fully offline."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def nano_engine():
    from engine.engine import Engine

    return Engine.load()


@pytest.fixture(scope="session")
def nano_components(nano_engine):
    return nano_engine.components


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread while this module runs. Why: on the shared 2-core test machines torch's default two
    threads thrash under load (a 64×32 clip measured 14–21 s with 2 threads, 1.2–1.5 s with 1)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
