import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for `tiny`


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(2)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
