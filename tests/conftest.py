"""Shared fixtures: a seeded RNG, the location of the optional model zoo, processes to clean up."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so tests can `import models`

ZOO = Path(os.environ.get("QDBG_MODELS", "/tmp/qdbg_models"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Process ids to SIGKILL after the test, so that a failing test leaves nothing running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def zoo_model():
    """Returns a function name -> folder of a built zoo model, skipping when it is absent."""
    def get(name: str) -> Path:
        folder = ZOO / name
        if not (folder / "model.onnx").is_file():
            pytest.skip(f"zoo model {name!r} not built at {folder} (see ../shared/models/README.md)")
        return folder
    return get


def pytest_collection_modifyitems(config, items):
    # Any test that asks for the zoo is a zoo test, whether or not its author marked it, so the
    # default run (`-m "not slow and not zoo"`) never depends on what a machine happens to hold.
    for item in items:
        if "zoo_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.zoo)
