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
