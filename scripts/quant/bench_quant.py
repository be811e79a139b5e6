"""References of the `quant` bench group (crates/ferrofx-bench/src/cases_quant.rs), imported by
scripts/bench_reference.py:

- cases(): PyTorch's int8 ResNet-18/50 from `torch.ao.quantization.quantize_fx` (prepare_fx with
  get_default_qconfig_mapping("x86"), calibrated on random images, convert_fx), timed at batch 1
  and 8 under the same ids as ferrofx's int8 cases;
- ort_cases(): onnxruntime's `quantize_static` QDQ model (per-channel int8 weights, uint8
  activations, MinMax calibration on the same random images) of the same torchvision model.

- dynamic_cases(): the transformer encoder of the compile group in float and after
  torch.ao.quantization.quantize_dynamic (per-channel int8 Linear weights).

Same weights and images as ferrofx: the bench's ferrofx side writes its float ResNets' state
dicts (torchvision's keys) to target/bench-quant/<arch>.safetensors, loaded here when present
(else torchvision's random initialisation under a fixed seed), and the images are ferrofx's
`cases::data` LCG, reproduced by `_lcg`. PyTorch's int8-vs-float top-1 agreement on the 256
agreement images is written to target/bench-quant/torch_agreement.json for the bench summary.
"""
import json
import os
import tempfile
import warnings

CALIBRATION_IMAGES = 16
AGREEMENT_IMAGES = 256
WEIGHTS_DIR = os.path.join("target", "bench-quant")


def _model(arch):
    import torch
    import torchvision
    torch.manual_seed(0)
    m = getattr(torchvision.models, arch)().eval()
    path = os.path.join(WEIGHTS_DIR, f"{arch}.safetensors")
    if os.path.exists(path):
        from safetensors.torch import load_file
        m.load_state_dict(load_file(path), strict=True)
    return m


def _lcg(n, seed):
    """ferrofx's `cases::data(n, seed)`: s = s * a + c (mod 2^64) from s0 = seed * a + c, value
    ((s >> 40) / 2^24) * 2 - 1, vectorised by doubling (s_{L+j} = A_j s_L + C_j)."""
    import numpy as np
    a, c = np.uint64(6364136223846793005), np.uint64(1442695040888963407)
    with np.errstate(over="ignore"):
        s0 = np.uint64(seed) * a + c
        mul, add = np.array([a], dtype=np.uint64), np.array([c], dtype=np.uint64)
        while len(mul) < n:
            ml, al = mul[-1], add[-1]
            mul, add = np.concatenate([mul, mul * ml]), np.concatenate([add, mul * al + add])
        s = mul[:n] * s0 + add[:n]
    return ((s >> np.uint64(40)).astype(np.float32) / np.float32(1 << 24)) * np.float32(2) - np.float32(1)


def _images(n, seed):
    import torch
    return torch.from_numpy(_lcg(n * 3 * 224 * 224, seed).reshape(n, 3, 224, 224))


def _record_agreement(arch, float_model, int8_model):
    import torch
    same = 0
    with torch.no_grad():
        for i in range(AGREEMENT_IMAGES // 8):
            x = _images(8, 1000 + i)
            same += int((float_model(x).argmax(1) == int8_model(x).argmax(1)).sum())
    path = os.path.join(WEIGHTS_DIR, "torch_agreement.json")
    data = {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data[arch] = [same, AGREEMENT_IMAGES]
    os.makedirs(WEIGHTS_DIR, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)


def _torch_int8(arch, cache={}):
    if arch not in cache:
        import torch
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
        torch.backends.quantized.engine = "x86"
        m = _model(arch)
        calib = _images(CALIBRATION_IMAGES, 7)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = prepare_fx(m, get_default_qconfig_mapping("x86"), example_inputs=(calib[:1],))
            with torch.no_grad():
                for i in range(0, CALIBRATION_IMAGES, 8):
                    prepared(calib[i:i + 8])
            cache[arch] = convert_fx(prepared)
        _record_agreement(arch, m, cache[arch])
    return cache[arch]


def cases():
    def torch_case(arch, batch):
        def make():
            q = _torch_int8(arch)
            x = _images(batch, 2)
            return lambda: q(x), 1
        return make

    return {f"quant_{short}_b{b}": torch_case(arch, b)
            for short, arch in (("r18", "resnet18"), ("r50", "resnet50")) for b in (1, 8)}


def _ort_int8(arch, batch, cache={}):
    if (arch, batch) not in cache:
        import numpy as np
        import onnxruntime as ort
        import torch
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        m = _model(arch)
        tmp = tempfile.gettempdir()
        fp = os.path.join(tmp, f"ferrofx_quant_{arch}_b{batch}_{os.getpid()}.onnx")
        qp = fp.replace(".onnx", ".int8.onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (_images(batch, 2),), fp, dynamo=False, input_names=["x"], output_names=["y"])
        calib = _images(CALIBRATION_IMAGES, 7).numpy()

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.batches = iter([{"x": calib[i:i + batch]} for i in range(0, CALIBRATION_IMAGES, batch)])

            def get_next(self):
                return next(self.batches, None)

        quantize_static(fp, qp, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(qp, so, providers=["CPUExecutionProvider"])
        os.remove(fp)
        os.remove(qp)
        x = _images(batch, 2).numpy()
        cache[(arch, batch)] = lambda: sess.run(None, {"x": x})
    return cache[(arch, batch)]


def ort_cases():
    def ort_case(arch, batch):
        return lambda: _ort_int8(arch, batch)

    return {f"quant_{short}_b{b}": ort_case(arch, b)
            for short, arch in (("r18", "resnet18"), ("r50", "resnet50")) for b in (1, 8)}


def dynamic_cases(transformer_classifier):
    """quant_transformer_float / quant_transformer_dynamic: PyTorch's twin of the compile
    group's transformer (from bench_reference.py) in float and after quantize_dynamic."""
    def make(dynamic):
        def setup():
            import torch
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
            m, ids = transformer_classifier()
            if dynamic:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    m = quantize_dynamic(m, {torch.nn.Linear: per_channel_dynamic_qconfig})

            def run():
                # the encoder layer's fast-path check reads `linear1.weight`, a method on a
                # dynamically quantized Linear (AttributeError): the int8 model runs without it
                fast = torch.backends.mha.get_fastpath_enabled()
                torch.backends.mha.set_fastpath_enabled(not dynamic and fast)
                try:
                    with torch.no_grad():
                        m(ids)
                finally:
                    torch.backends.mha.set_fastpath_enabled(fast)
            return run, 1
        return setup

    # quant_transformer_dynamic_attn (ferrofx also quantizes the attention projections, which
    # PyTorch's quantize_dynamic cannot) is measured against the same PyTorch int8 model
    return {"quant_transformer_float": make(False), "quant_transformer_dynamic": make(True),
            "quant_transformer_dynamic_attn": make(True)}
