import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for `tiny`


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(2)
    yield
