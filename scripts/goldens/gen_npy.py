"""Writes the .npy files the CLI tests read (crates/ferrofx-cli/tests/data/), with NumPy itself,
so `ferrofx run` is checked against files NumPy wrote (not only against its own writer).

    .venv/bin/python scripts/goldens/gen_npy.py

- digits2.npy: the first two digits of the embedded data set, (2, 1, 8, 8) float32, C order;
- fortran_i64.npy: arange(24) as int64, shape (2, 3, 4), Fortran order;
- scalar_f64.npy: a 0-d float64 array (2.5).
"""
import gzip
import pathlib

import numpy as np

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "crates" / "ferrofx-cli" / "tests" / "data"
out.mkdir(parents=True, exist_ok=True)
data = root / "crates" / "ferrofx-nn" / "data" / "digits.csv.gz"
rows = [line.split(",") for line in gzip.open(data, "rt").read().strip().splitlines()]
pixels = np.array([[float(v) for v in r[:64]] for r in rows[:2]], dtype=np.float32) / 16.0
np.save(out / "digits2.npy", pixels.reshape(2, 1, 8, 8))
np.save(out / "fortran_i64.npy", np.asfortranarray(np.arange(24, dtype=np.int64).reshape(2, 3, 4)))
np.save(out / "scalar_f64.npy", np.array(2.5, dtype=np.float64))
print("wrote", sorted(p.name for p in out.glob("*.npy")))
