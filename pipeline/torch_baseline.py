"""PyTorch as a baseline (cuBLAS / cuDNN on the GPU): the same computation as a kernel of the
evaluation, for the families PyTorch has a library call for (matmul, batch matmul, dense,
conv1d / conv2d, softmax, layer / RMS norm, the te_workload GMM, C1D, C2D, SFM and NRM).

`for_kernel(key)` gives a function of the kernel's input arrays (in the kernel's argument
order and layouts, outputs left out) that returns its output, so the result is checked against
the kernel's own reference before it is timed; `time_call` times it like TVM's evaluator
(warm-up, then the median of repeats of at least `min_repeat_ms`).
"""

from __future__ import annotations

import time
from collections.abc import Callable


def _te_params(key: str):
    from tvm.s_tir.meta_schedule.testing import te_workload

    name, _, idx = key.partition(":")
    return name, te_workload.CONFIGS[name][1][int(idx)]


def for_kernel(key: str, spec: dict | None = None) -> Callable | None:
    """`key`: a te_workload item ("GMM:1") or a catalog workload id with its `spec`
    ({"family", "params", "dtype"}, as Spec.to_json). None where PyTorch has no single library call for it."""
    import torch
    import torch.nn.functional as F

    if spec is None:
        try:
            name, p = _te_params(key)
        except (KeyError, IndexError, ValueError):
            return None
        if name == "GMM":
            return lambda x, y: torch.bmm(x, y)
        if name == "SFM":
            return lambda a: torch.softmax(a, dim=1)
        if name == "NRM":
            return lambda a: torch.sqrt((a * a).sum(dim=(1, 2)))
        if name in ("C2D", "GRP", "DIL"):        # conv2d_nhwc: (N, H, W, CI, CO, k, stride, pad[, dilation, groups])
            stride, pad, *rest = p[6:]
            dil, groups = (list(rest) + [1, 1])[:2]
            return lambda x, w: F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), stride=stride, padding=pad,
                                         dilation=dil, groups=groups).permute(0, 2, 3, 1)
        if name == "C1D":
            _, _, _, _, _, stride, pad = p[:7]
            return lambda x, w: F.conv1d(x.permute(0, 2, 1), w.permute(2, 1, 0), stride=stride,
                                         padding=pad).permute(0, 2, 1)
        return None
    family, p = spec["family"], spec["params"]
    if family == "matmul":
        return lambda a, b: a @ b
    if family == "dense":
        return lambda x, w: x @ w.T
    if family == "batch_matmul":
        return (lambda a, b: torch.bmm(a, b.transpose(1, 2))) if p[4] else (lambda a, b: torch.bmm(a, b))
    if family == "softmax":
        return lambda x: torch.softmax(x.float(), dim=-1).to(x.dtype)
    if family == "layer_norm":
        cols, rms = p[1], p[2]
        if rms:
            return lambda x, g: (x.float() * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6)
                                 * g.float()).to(x.dtype)
        return lambda x, g, b: F.layer_norm(x.float(), (cols,), g.float(), b.float(), 1e-5).to(x.dtype)
    if family == "conv2d":
        _, _, _, _, _, stride, pad, dil, groups = p
        return lambda x, w: F.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=groups)
    return None


def time_call(fn: Callable, args: list, repeat: int = 5, min_repeat_ms: float = 20.0) -> float:
    """Median seconds per call (CUDA: device time between events; CPU: wall time)."""
    import torch

    cuda = any(getattr(a, "is_cuda", False) for a in args)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    with torch.no_grad():
        fn(*args)
        sync()
        number, t0 = 1, time.perf_counter()
        fn(*args)
        sync()
        once = max(time.perf_counter() - t0, 1e-7)
        number = max(1, int(min_repeat_ms / 1000 / once))
        results = []
        for _ in range(repeat):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(number):
                    fn(*args)
                end.record()
                torch.cuda.synchronize()
                results.append(start.elapsed_time(end) / 1000 / number)
            else:
                t0 = time.perf_counter()
                for _ in range(number):
                    fn(*args)
                results.append((time.perf_counter() - t0) / number)
    results.sort()
    return results[len(results) // 2]


def measure(mod, key: str, spec: dict | None, reference_output, device: str, seed: int = 0) -> dict:
    """PyTorch's latency for the kernel `mod` on `device` ("cuda" or "cpu"), after checking
    its output against `reference_output` (the kernel's output on the same random inputs)."""
    import numpy as np
    import torch

    from pipeline.measure import random_inputs

    fn = for_kernel(key, spec)
    if fn is None:
        return {"latency_s": None, "error": "no PyTorch library call for this kernel"}
    arrays = random_inputs(mod, seed)[:-1]                  # the inputs; the last argument is the output
    args = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]
    with torch.no_grad():
        out = fn(*args)
    got = out.float().cpu().numpy()
    ref = np.asarray(reference_output, dtype=np.float32)
    if got.shape != ref.shape or not np.allclose(got, ref, rtol=2e-2, atol=2e-2):
        return {"latency_s": None, "error": "PyTorch's output differs from the kernel's reference"}
    return {"latency_s": time_call(fn, args), "error": None}
