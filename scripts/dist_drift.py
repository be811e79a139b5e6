"""Issue 22: how far `mpirun -np N ferrofx train --data-parallel` ends from `ferrofx train`.

For each epoch count k it trains the digits CNN k epochs (the default run otherwise: batch 32,
4 batch shards, Adam with one-cycle, the given seed) once in one process and once data parallel
over N ranks, and prints the largest absolute weight difference (and where), and both test
accuracies. With `--sync-batchnorm` the data-parallel run uses BatchNorm over the global batch
(`--data-parallel --sync-batchnorm`) and the process one shard (`--batch-shards 1`): the old
semantics, equal only within rounding.

    python scripts/dist_drift.py --epochs 1 2 4 8 12 --seed 0 --ranks 2
    python scripts/dist_drift.py --epochs 1 2 4 8 12 --seed 0 --ranks 2 --sync-batchnorm

Needs ferrofx built with MPI (`cargo build --release -p ferrofx-cli --features mpi`; the binary
is taken from target/release) and `mpirun`; numpy and safetensors (the repo's .venv has them).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
    found = re.findall(r"test accuracy ([0-9.]+)%", out.stdout)
    return float(found[-1]) if found else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 4, 8, 12])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--sync-batchnorm", action="store_true")
    ap.add_argument("--exe", default=os.path.join(ROOT, "target", "release", "ferrofx"))
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mode = "SyncBatchNorm vs --batch-shards 1" if a.sync_batchnorm else "fixed batch shards"
    print(f"seed {a.seed}, batch {a.batch_size}, {a.ranks} ranks vs 1 process, {mode}")
    print("epochs | steps | max |dw| | in | accuracy 1 proc | accuracy DP")
    with tempfile.TemporaryDirectory() as d:
        for k in a.epochs:
            common = ["train", "--seed", str(a.seed), "--epochs", str(k), "--batch-size", str(a.batch_size)]
            one, dp = os.path.join(d, f"one{k}.safetensors"), os.path.join(d, f"dp{k}.safetensors")
            single = ["--batch-shards", "1"] if a.sync_batchnorm else []
            acc1 = run([a.exe, *common, *single, "-o", one], env)
            mpirun = ["mpirun", "-np", str(a.ranks), "--oversubscribe"]
            dist = ["--data-parallel", "--sync-batchnorm"] if a.sync_batchnorm else ["--data-parallel"]
            acc2 = run([*mpirun, a.exe, *common, *dist, "-o", dp], env)
            x, y = load_file(one), load_file(dp)
            worst, where = 0.0, ""
            for name in x:
                diff = float(np.max(np.abs(x[name].astype(np.float64) - y[name].astype(np.float64)), initial=0.0))
                if diff > worst:
                    worst, where = diff, name
            steps = k * -(-1437 // a.batch_size)
            print(f"{k:6} | {steps:5} | {worst:.3e} | {where} | {acc1:.2f}% | {acc2:.2f}%", flush=True)


if __name__ == "__main__":
    main()
