"""Regenerates every golden file: `.venv/bin/python scripts/goldens/gen_all.py [family ...]`.

Each `cases_<family>.py` module defines `CASES: list[Case]`.
"""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from golden import generate  # noqa: E402

if not torch.__version__.startswith("2.15"):
    print(f"warning: goldens are pinned to torch 2.15.*, found {torch.__version__}", file=sys.stderr)
torch.set_num_threads(1)

here = os.path.dirname(__file__)
families = sys.argv[1:] or sorted(
    f[len("cases_"):-3] for f in os.listdir(here) if f.startswith("cases_") and f.endswith(".py")
)
for fam in families:
    mod = importlib.import_module(f"cases_{fam}")
    generate(fam, mod.CASES)
