"""References of the `quant` bench group (crates/ferrofx-bench/src/cases_quant.rs), imported by
scripts/bench_reference.py:

- cases(): PyTorch's int8 ResNet-18/50 from `torch.ao.quantization.quantize_fx` (prepare_fx with
  get_default_qconfig_mapping("x86"), calibrated on random images, convert_fx), timed at batch 1
  and 8 under the same ids as ferrofx's int8 cases;
- ort_cases(): onnxruntime's `quantize_static` QDQ model (per-channel int8 weights, uint8
  activations, MinMax calibration on the same random images) of the same torchvision model.

The weights are torchvision's random initialisation under a fixed seed (ferrofx's cases use
ferrofx's own random initialisation of the same architecture): speed does not depend on the
values, and each engine's int8 model is compared with its own float model.
"""
import os
import tempfile
import warnings

CALIBRATION_IMAGES = 16


def _model(arch):
    import torch
    import torchvision
    torch.manual_seed(0)
    return getattr(torchvision.models, arch)().eval()


def _images(n, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 224, 224, generator=g) * 2 - 1


def _torch_int8(arch, cache={}):
    if arch not in cache:
        import torch
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
        torch.backends.quantized.engine = "x86"
        m = _model(arch)
        calib = _images(CALIBRATION_IMAGES, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = prepare_fx(m, get_default_qconfig_mapping("x86"), example_inputs=(calib[:1],))
            with torch.no_grad():
                for i in range(0, CALIBRATION_IMAGES, 8):
                    prepared(calib[i:i + 8])
            cache[arch] = convert_fx(prepared)
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
        calib = _images(CALIBRATION_IMAGES, 1).numpy()

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
