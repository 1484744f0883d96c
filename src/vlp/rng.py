"""This process's global random generators: Python's, NumPy's and torch's (CPU and every CUDA device).

Below the models (ARCHITECTURE.md): the training loop seeds each rank with it, the importers seed the parts a
released file lacks, the steps seed a model's initialisation.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
