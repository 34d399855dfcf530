"""The workload catalog: the project's own kernels, as TIR PrimFuncs, deterministic from a seed.

    little-dragon catalog            # writes data/catalog.jsonl (one spec per line)
    little-dragon catalog --verify   # also hashes every workload and writes reports/catalog.json

A workload is a `Spec`: a family name, its integer shape parameters and a dtype. `build(spec)`
turns it into an IRModule with one PrimFunc `main`. Shapes come from real model families
(ResNet, MobileNet, BERT, GPT-2, Llama; prefill and decode token counts). TVM's own
operator suite (`te_workload`, the held-out benchmark) is never reproduced: `held_out_hashes()`
gives its structural hashes and the catalog test checks that none of ours coincides.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from typing import Callable, Iterator

from pipeline.tvm_env import structural_hash, te, tvm

# ---------------------------------------------------------------------------------------
# Shapes from model families
# ---------------------------------------------------------------------------------------
# Hidden/intermediate sizes: BERT base/large, GPT-2 s/m/l/xl, Llama 7B/13B, ResNet/MobileNet heads.
HIDDEN = [256, 384, 512, 768, 1024, 1280, 1600, 2048, 2560, 3072, 4096, 5120]
FFN = [1000, 1280, 2304, 3072, 3840, 4096, 4800, 5120, 6400, 8192, 11008, 13824]
# Tokens per step: decode (1, small batches) and prefill (sequence x batch).
TOKENS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048]
SEQ = [32, 64, 128, 196, 256, 384, 512, 1024]
HEADS = [4, 8, 12, 16, 20, 25, 32, 40]
HEAD_DIM = [32, 64, 80, 96, 128]
BATCH = [1, 2, 4, 8, 16]
DTYPES = ["float32", "float16"]
# (H=W, C_in, C_out, kernel, stride, pad): ResNet-18/50 and VGG-like layers.
CONV_LAYERS = [
    (56, 64, 64, 3, 1, 1), (56, 64, 128, 3, 2, 1), (28, 128, 128, 3, 1, 1),
    (28, 128, 256, 3, 2, 1), (14, 256, 256, 3, 1, 1), (14, 256, 512, 3, 2, 1),
    (7, 512, 512, 3, 1, 1), (56, 64, 256, 1, 1, 0), (56, 256, 64, 1, 1, 0),
    (28, 512, 128, 1, 1, 0), (28, 128, 512, 1, 1, 0), (14, 1024, 256, 1, 1, 0),
    (14, 256, 1024, 1, 1, 0), (7, 2048, 512, 1, 1, 0), (7, 512, 2048, 1, 1, 0),
    (112, 32, 64, 3, 1, 1), (112, 64, 64, 3, 2, 1), (224, 3, 32, 3, 2, 1),
    (224, 3, 64, 7, 2, 3), (32, 64, 64, 3, 1, 1), (16, 128, 128, 3, 1, 1), (8, 256, 256, 3, 1, 1),
]
# MobileNet v1/v2 depthwise layers: (H=W, channels, stride).
DW_LAYERS = [(112, 32, 1), (112, 96, 2), (56, 144, 1), (56, 144, 2), (28, 192, 1), (28, 192, 2),
             (14, 384, 1), (14, 576, 1), (14, 576, 2), (7, 960, 1), (56, 128, 1), (28, 256, 1),
             (14, 512, 1), (7, 1024, 1), (112, 64, 2), (56, 128, 2), (28, 256, 2), (14, 512, 2)]


@dataclass(frozen=True)
class Spec:
    family: str
    params: tuple[int, ...]
    dtype: str

    @property
    def id(self) -> str:
        """Stable id: family plus a short digest of the full spec."""
        digest = hashlib.sha1(self.key().encode()).hexdigest()[:10]
        return f"{self.family}-{digest}"

    def key(self) -> str:
        return json.dumps([self.family, list(self.params), self.dtype])

    def to_json(self) -> dict:
        return {"id": self.id, "family": self.family, "params": list(self.params), "dtype": self.dtype}

    @staticmethod
    def from_json(obj: dict) -> "Spec":
        return Spec(obj["family"], tuple(int(p) for p in obj["params"]), obj["dtype"])


class UnknownWorkload(KeyError):
    """A spec whose family is not in the catalog."""


# ---------------------------------------------------------------------------------------
# Compute definitions (TE). fp16 kernels accumulate in fp32 and cast the result back.
# ---------------------------------------------------------------------------------------

def _acc(dtype: str) -> str:
    return "float32"


def _out(x, dtype: str, name: str):
    if dtype == "float32":
        return x
    return te.compute(x.shape, lambda *i: x(*i).astype(dtype), name=name + "_cast")


def _matmul(m, n, k, dtype):
    a = te.placeholder((m, k), dtype, name="A")
    b = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(_acc(dtype)) * b[r, j].astype(_acc(dtype)), axis=r), name="matmul")
    return [a, b], c


def _dense(m, n, k, dtype):  # weight stored [N, K] as in nn.Linear
    a = te.placeholder((m, k), dtype, name="X")
    w = te.placeholder((n, k), dtype, name="W")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(_acc(dtype)) * w[j, r].astype(_acc(dtype)), axis=r), name="dense")
    return [a, w], c


def _act(x, kind: int, name: str):
    if kind == 0:
        return te.compute(x.shape, lambda *i: te.max(x(*i), tvm.tirx.const(0, x.dtype)), name=name + "_relu")
    if kind == 1:  # tanh-approximated GELU as in GPT-2
        c = tvm.tirx.const
        return te.compute(x.shape, lambda *i: c(0.5, x.dtype) * x(*i) * (c(1, x.dtype) + te.tanh(
            c(0.7978845608, x.dtype) * (x(*i) + c(0.044715, x.dtype) * x(*i) * x(*i) * x(*i)))), name=name + "_gelu")
    return te.compute(x.shape, lambda *i: x(*i) * te.sigmoid(x(*i)), name=name + "_silu")  # Llama


def f_matmul(p, dtype):
    ins, c = _matmul(*p, dtype)
    return ins + [_out(c, dtype, "matmul")]


def f_dense(p, dtype):
    ins, c = _dense(*p, dtype)
    return ins + [_out(c, dtype, "dense")]


def f_dense_bias_act(p, dtype):
    m, n, k, act = p
    ins, c = _dense(m, n, k, "float32" if dtype == "float32" else dtype)
    bias = te.placeholder((n,), "float32", name="bias")
    y = te.compute((m, n), lambda i, j: c[i, j] + bias[j], name="bias_add")
    return ins + [bias, _out(_act(y, act, "dense"), dtype, "out")]


def f_batch_matmul(p, dtype):  # attention-style: [B, M, K] x [B, K, N]
    bsz, m, n, k, trans_b = p
    a = te.placeholder((bsz, m, k), dtype, name="A")
    b = te.placeholder((bsz, n, k) if trans_b else (bsz, k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    if trans_b:
        c = te.compute((bsz, m, n), lambda x, i, j: te.sum(a[x, i, r].astype("float32") * b[x, j, r].astype("float32"), axis=r), name="bmm")
    else:
        c = te.compute((bsz, m, n), lambda x, i, j: te.sum(a[x, i, r].astype("float32") * b[x, r, j].astype("float32"), axis=r), name="bmm")
    return [a, b, _out(c, dtype, "bmm")]


def _softmax_last(x, name):
    n_axis = len(x.shape)
    last = x.shape[-1]
    k1 = te.reduce_axis((0, last), name="k1")
    mx = te.compute(x.shape[:-1], lambda *i: te.max(x(*i, k1), axis=k1), name=name + "_max")
    ex = te.compute(x.shape, lambda *i: te.exp(x(*i) - mx(*i[: n_axis - 1])), name=name + "_exp")
    k2 = te.reduce_axis((0, last), name="k2")
    sm = te.compute(x.shape[:-1], lambda *i: te.sum(ex(*i, k2), axis=k2), name=name + "_sum")
    return te.compute(x.shape, lambda *i: ex(*i) / sm(*i[: n_axis - 1]), name=name + "_norm")


def f_attention_score(p, dtype):  # softmax(Q K^T * scale)
    bsz, m, n, k = p
    q = te.placeholder((bsz, m, k), dtype, name="Q")
    kk = te.placeholder((bsz, n, k), dtype, name="K")
    r = te.reduce_axis((0, k), name="r")
    s = te.compute((bsz, m, n), lambda x, i, j: te.sum(q[x, i, r].astype("float32") * kk[x, j, r].astype("float32"), axis=r), name="qk")
    scaled = te.compute(s.shape, lambda x, i, j: s[x, i, j] * tvm.tirx.const(1.0 / (k ** 0.5), "float32"), name="scale")
    return [q, kk, _out(_softmax_last(scaled, "softmax"), dtype, "score")]


def f_softmax(p, dtype):
    rows, cols = p
    x = te.placeholder((rows, cols), dtype, name="X")
    xf = x if dtype == "float32" else te.compute(x.shape, lambda i, j: x[i, j].astype("float32"), name="upcast")
    return [x, _out(_softmax_last(xf, "softmax"), dtype, "softmax")]


def f_layer_norm(p, dtype):
    rows, cols, rms = p
    x = te.placeholder((rows, cols), dtype, name="X")
    g = te.placeholder((cols,), dtype, name="gamma")
    k1 = te.reduce_axis((0, cols), name="k1")
    k2 = te.reduce_axis((0, cols), name="k2")
    f32 = "float32"
    if rms:
        ss = te.compute((rows,), lambda i: te.sum(x[i, k1].astype(f32) * x[i, k1].astype(f32), axis=k1), name="sumsq")
        y = te.compute((rows, cols), lambda i, j: x[i, j].astype(f32) * te.rsqrt(ss[i] / cols + tvm.tirx.const(1e-6, f32)) * g[j].astype(f32), name="rms_norm")
        return [x, g, _out(y, dtype, "rms_norm")]
    s1 = te.compute((rows,), lambda i: te.sum(x[i, k1].astype(f32), axis=k1), name="sum")
    s2 = te.compute((rows,), lambda i: te.sum(x[i, k2].astype(f32) * x[i, k2].astype(f32), axis=k2), name="sumsq")
    b = te.placeholder((cols,), dtype, name="beta")

    def norm(i, j):
        mean = s1[i] / cols
        var = s2[i] / cols - mean * mean
        return (x[i, j].astype(f32) - mean) * te.rsqrt(var + tvm.tirx.const(1e-5, f32)) * g[j].astype(f32) + b[j].astype(f32)

    return [x, g, b, _out(te.compute((rows, cols), norm, name="layer_norm"), dtype, "layer_norm")]


def f_reduce(p, dtype):  # kind: 0 sum, 1 max, 2 mean over the last axis
    rows, cols, kind = p
    x = te.placeholder((rows, cols), dtype, name="X")
    k = te.reduce_axis((0, cols), name="k")
    if kind == 1:
        y = te.compute((rows,), lambda i: te.max(x[i, k], axis=k), name="row_max")
        return [x, y]
    y = te.compute((rows,), lambda i: te.sum(x[i, k].astype("float32"), axis=k), name="row_sum")
    if kind == 2:
        y = te.compute((rows,), lambda i: y[i] / tvm.tirx.const(cols, "float32"), name="row_mean")
    return [x, _out(y, dtype, "reduce")]


def f_elementwise(p, dtype):  # chains as fused by compilers: (x + y) * s, then an activation
    rows, cols, depth = p
    x = te.placeholder((rows, cols), dtype, name="X")
    y = te.placeholder((rows, cols), dtype, name="Y")
    z = te.compute((rows, cols), lambda i, j: x[i, j] + y[i, j], name="add")
    for d in range(depth):
        z = _act(_scale(z, 0.5 + d, f"mul{d}"), d % 3, f"e{d}")
    return [x, y, z]


def _scale(z, factor: float, name: str):
    return te.compute(z.shape, lambda i, j: z[i, j] * tvm.tirx.const(factor, z.dtype), name=name)


def _conv2d(n, h, w, ci, co, kh, stride, pad, dil, groups, dtype, bias_relu=False):
    x = te.placeholder((n, ci, h, w), dtype, name="data")
    wt = te.placeholder((co, ci // groups, kh, kh), dtype, name="weight")
    padded = te.compute(
        (n, ci, h + 2 * pad, w + 2 * pad),
        lambda b, c, i, j: tvm.tirx.if_then_else(
            tvm.tirx.all(i >= pad, i < h + pad, j >= pad, j < w + pad), x[b, c, i - pad, j - pad], tvm.tirx.const(0, dtype)),
        name="pad")
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    cig = ci // groups
    rc = te.reduce_axis((0, cig), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kh), name="rx")
    out = te.compute(
        (n, co, oh, ow),
        lambda b, f, i, j: te.sum(
            padded[b, f // (co // groups) * cig + rc, i * stride + ry * dil, j * stride + rx * dil].astype("float32")
            * wt[f, rc, ry, rx].astype("float32"), axis=[rc, ry, rx]),
        name="conv2d")
    ins = [x, wt]
    if bias_relu:
        bias = te.placeholder((co,), "float32", name="bias")
        out = te.compute(out.shape, lambda b, f, i, j: te.max(out[b, f, i, j] + bias[f], tvm.tirx.const(0, "float32")), name="bias_relu")
        ins.append(bias)
    return ins + [_out(out, dtype, "conv2d")]


def f_conv2d(p, dtype):  # (n, h, ci, co, k, stride, pad, dilation, groups)
    n, h, ci, co, k, s, pad, dil, g = p
    return _conv2d(n, h, h, ci, co, k, s, pad, dil, g, dtype)


def f_conv2d_bias_relu(p, dtype):
    n, h, ci, co, k, s, pad = p
    return _conv2d(n, h, h, ci, co, k, s, pad, 1, 1, dtype, bias_relu=True)


def f_depthwise_conv2d(p, dtype):
    n, h, c, k, s = p
    return _conv2d(n, h, h, c, c, k, s, k // 2, 1, c, dtype)


def f_conv1d(p, dtype):  # NCW, e.g. wav2vec / TCN layers
    n, length, ci, co, k, s = p
    x = te.placeholder((n, ci, length), dtype, name="data")
    wt = te.placeholder((co, ci, k), dtype, name="weight")
    pad = k // 2
    padded = te.compute((n, ci, length + 2 * pad), lambda b, c, i: tvm.tirx.if_then_else(
        tvm.tirx.all(i >= pad, i < length + pad), x[b, c, i - pad], tvm.tirx.const(0, dtype)), name="pad")
    ol = (length + 2 * pad - k) // s + 1
    rc = te.reduce_axis((0, ci), name="rc")
    rk = te.reduce_axis((0, k), name="rk")
    out = te.compute((n, co, ol), lambda b, f, i: te.sum(
        padded[b, rc, i * s + rk].astype("float32") * wt[f, rc, rk].astype("float32"), axis=[rc, rk]), name="conv1d")
    return [x, wt, _out(out, dtype, "conv1d")]


def f_conv3d(p, dtype):  # NCDHW video layers (C3D / R3D)
    n, d, h, ci, co, k, s = p
    x = te.placeholder((n, ci, d, h, h), dtype, name="data")
    wt = te.placeholder((co, ci, k, k, k), dtype, name="weight")
    pad = k // 2
    padded = te.compute((n, ci, d + 2 * pad, h + 2 * pad, h + 2 * pad), lambda b, c, z, i, j: tvm.tirx.if_then_else(
        tvm.tirx.all(z >= pad, z < d + pad, i >= pad, i < h + pad, j >= pad, j < h + pad),
        x[b, c, z - pad, i - pad, j - pad], tvm.tirx.const(0, dtype)), name="pad")
    od, oh = (d + 2 * pad - k) // s + 1, (h + 2 * pad - k) // s + 1
    rc, rz, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in [(ci, "rc"), (k, "rz"), (k, "ry"), (k, "rx")])
    out = te.compute((n, co, od, oh, oh), lambda b, f, z, i, j: te.sum(
        padded[b, rc, z * s + rz, i * s + ry, j * s + rx].astype("float32") * wt[f, rc, rz, ry, rx].astype("float32"),
        axis=[rc, rz, ry, rx]), name="conv3d")
    return [x, wt, _out(out, dtype, "conv3d")]


def f_conv2d_transpose(p, dtype):  # stride-2 upsampling as in U-Net/DCGAN decoders
    n, h, ci, co, k, s = p
    x = te.placeholder((n, ci, h, h), dtype, name="data")
    wt = te.placeholder((ci, co, k, k), dtype, name="weight")
    pad = k - 1 - (k - s) // 2
    dil_h = (h - 1) * s + 1 + 2 * pad
    dilated = te.compute((n, ci, dil_h, dil_h), lambda b, c, i, j: tvm.tirx.if_then_else(
        tvm.tirx.all(i >= pad, j >= pad, i < dil_h - pad, j < dil_h - pad,
                     (i - pad) % s == 0, (j - pad) % s == 0),
        x[b, c, (i - pad) // s, (j - pad) // s], tvm.tirx.const(0, dtype)), name="dilate_pad")
    oh = dil_h - k + 1
    rc, ry, rx = te.reduce_axis((0, ci), name="rc"), te.reduce_axis((0, k), name="ry"), te.reduce_axis((0, k), name="rx")
    out = te.compute((n, co, oh, oh), lambda b, f, i, j: te.sum(
        dilated[b, rc, i + ry, j + rx].astype("float32") * wt[rc, f, k - 1 - ry, k - 1 - rx].astype("float32"),
        axis=[rc, ry, rx]), name="conv2d_transpose")
    return [x, wt, _out(out, dtype, "conv2d_transpose")]


def f_pool2d(p, dtype):  # kind 0 max, 1 avg
    n, h, c, k, s, kind = p
    x = te.placeholder((n, c, h, h), dtype, name="data")
    oh = (h - k) // s + 1
    ry, rx = te.reduce_axis((0, k), name="ry"), te.reduce_axis((0, k), name="rx")
    if kind == 0:
        out = te.compute((n, c, oh, oh), lambda b, f, i, j: te.max(x[b, f, i * s + ry, j * s + rx], axis=[ry, rx]), name="max_pool")
        return [x, out]
    acc = te.compute((n, c, oh, oh), lambda b, f, i, j: te.sum(x[b, f, i * s + ry, j * s + rx].astype("float32"), axis=[ry, rx]), name="pool_sum")
    avg = te.compute(acc.shape, lambda *i: acc(*i) / tvm.tirx.const(k * k, "float32"), name="avg_pool")
    return [x, _out(avg, dtype, "avg_pool")]


# ---------------------------------------------------------------------------------------
# Families: a builder and a generator of parameter tuples drawn from the model shapes.
# ---------------------------------------------------------------------------------------

def _g_matmul() -> Iterator[tuple]:
    yield from itertools.product(TOKENS, HIDDEN + FFN[:6], HIDDEN)


def _g_dense() -> Iterator[tuple]:
    for m, n, k in itertools.product(TOKENS, HIDDEN + FFN, HIDDEN + FFN):
        if n != k or n in HIDDEN:
            yield (m, n, k)


def _g_dense_bias_act() -> Iterator[tuple]:
    for m, h, f, act in itertools.product(TOKENS, HIDDEN, FFN, (0, 1, 2)):
        yield (m, f, h, act)  # up projection with activation


def _g_batch_matmul() -> Iterator[tuple]:
    for b, heads, s, d, tb in itertools.product(BATCH, HEADS, SEQ, HEAD_DIM, (0, 1)):
        yield (b * heads, s, s if tb else d, d if tb else s, tb)  # QK^T or score x V
    for b, heads, s, d in itertools.product(BATCH, HEADS, SEQ, HEAD_DIM):  # decode: one query
        yield (b * heads, 1, s, d, 1)


def _g_attention_score() -> Iterator[tuple]:
    for b, heads, s, d in itertools.product(BATCH, HEADS, SEQ, HEAD_DIM):
        yield (b * heads, s, s, d)
        yield (b * heads, 1, s, d)


def _g_softmax() -> Iterator[tuple]:
    for b, heads, s in itertools.product(BATCH, HEADS, SEQ):
        yield (b * heads * s, s)
    for t, v in itertools.product(TOKENS, [1000, 30522, 50257, 32000]):
        yield (t, v)  # classifier / LM-head softmax


def _g_layer_norm() -> Iterator[tuple]:
    for t, h, rms in itertools.product(TOKENS + [4096, 8192], HIDDEN, (0, 1)):
        yield (t, h, rms)


def _g_reduce() -> Iterator[tuple]:
    for t, h, kind in itertools.product(TOKENS + [4096], HIDDEN + FFN, (0, 1, 2)):
        yield (t, h, kind)


def _g_elementwise() -> Iterator[tuple]:
    for t, h, depth in itertools.product(TOKENS, HIDDEN + FFN, (1, 2, 3)):
        yield (t, h, depth)


def _g_conv2d() -> Iterator[tuple]:
    for n, (h, ci, co, k, s, pad) in itertools.product(BATCH, CONV_LAYERS):
        yield (n, h, ci, co, k, s, pad, 1, 1)              # plain / strided
        if k == 3:
            yield (n, h, ci, co, k, s, 2, 2, 1)            # dilated
            for g in (2, 4, 8, 32):                        # grouped (ResNeXt)
                if ci % g == 0 and co % g == 0 and ci // g >= 2:
                    yield (n, h, ci, co, k, s, pad, 1, g)


def _g_conv2d_bias_relu() -> Iterator[tuple]:
    for n, layer in itertools.product(BATCH, CONV_LAYERS):
        yield (n, *layer)


def _g_depthwise() -> Iterator[tuple]:
    for n, (h, c, s), k in itertools.product(BATCH, DW_LAYERS, (3, 5)):
        yield (n, h, c, k, s)


def _g_conv1d() -> Iterator[tuple]:
    for n, length, (ci, co), k, s in itertools.product(
            BATCH, [100, 160, 400, 800, 1600], [(1, 64), (64, 64), (64, 128), (128, 128), (256, 256), (512, 512)], (3, 5, 7), (1, 2)):
        yield (n, length, ci, co, k, s)


def _g_conv3d() -> Iterator[tuple]:
    for n, d, (h, ci, co), k, s in itertools.product(
            BATCH[:3], (4, 8, 16), [(56, 3, 32), (56, 32, 64), (28, 64, 128), (14, 128, 256), (7, 256, 256)], (1, 3), (1, 2)):
        yield (n, d, h, ci, co, k, s)


def _g_conv2d_transpose() -> Iterator[tuple]:
    for n, (h, ci, co), k in itertools.product(BATCH, [(4, 1024, 512), (8, 512, 256), (16, 256, 128), (32, 128, 64), (64, 64, 32), (7, 256, 128), (14, 128, 64)], (2, 4)):
        yield (n, h, ci, co, k, 2)


def _g_pool2d() -> Iterator[tuple]:
    for n, (h, c), (k, s), kind in itertools.product(
            BATCH, [(112, 64), (56, 64), (56, 256), (28, 128), (28, 512), (14, 256), (14, 1024), (7, 512), (7, 2048)],
            [(2, 2), (3, 2), (3, 1)], (0, 1)):
        yield (n, h, c, k, s, kind)


FAMILIES: dict[str, tuple[Callable, Callable[[], Iterator[tuple]]]] = {
    "matmul": (f_matmul, _g_matmul),
    "dense": (f_dense, _g_dense),
    "dense_bias_act": (f_dense_bias_act, _g_dense_bias_act),
    "batch_matmul": (f_batch_matmul, _g_batch_matmul),
    "attention_score": (f_attention_score, _g_attention_score),
    "softmax": (f_softmax, _g_softmax),
    "layer_norm": (f_layer_norm, _g_layer_norm),
    "reduce": (f_reduce, _g_reduce),
    "elementwise": (f_elementwise, _g_elementwise),
    "conv2d": (f_conv2d, _g_conv2d),
    "conv2d_bias_relu": (f_conv2d_bias_relu, _g_conv2d_bias_relu),
    "depthwise_conv2d": (f_depthwise_conv2d, _g_depthwise),
    "conv1d": (f_conv1d, _g_conv1d),
    "conv3d": (f_conv3d, _g_conv3d),
    "conv2d_transpose": (f_conv2d_transpose, _g_conv2d_transpose),
    "pool2d": (f_pool2d, _g_pool2d),
}


def build(spec: Spec) -> "tvm.IRModule":
    """The IRModule (one PrimFunc `main`) of a catalog spec."""
    if spec.family not in FAMILIES:
        raise UnknownWorkload(f"unknown workload family {spec.family!r}; known: {sorted(FAMILIES)}")
    tensors = FAMILIES[spec.family][0](spec.params, spec.dtype)
    return tvm.IRModule({"main": te.create_prim_func(tensors)})


def catalog(seed: int = 0, families: list[str] | None = None) -> list[Spec]:
    """Every spec of the catalog, deduplicated, in an order shuffled by `seed`."""
    seen: set[Spec] = set()
    specs: list[Spec] = []
    for name in families or sorted(FAMILIES):
        if name not in FAMILIES:
            raise UnknownWorkload(f"unknown workload family {name!r}; known: {sorted(FAMILIES)}")
        for params in FAMILIES[name][1]():
            for dtype in DTYPES:
                spec = Spec(name, tuple(params), dtype)
                if spec not in seen:
                    seen.add(spec)
                    specs.append(spec)
    random.Random(seed).shuffle(specs)
    return specs


def held_out_hashes() -> dict[str, str]:
    """Structural hash -> name of every workload in TVM's te_workload suite (held out)."""
    from tvm.s_tir.meta_schedule.testing import te_workload

    hashes = {}
    for name, (_, configs) in te_workload.CONFIGS.items():
        for idx in range(len(configs)):
            try:
                func = te_workload.create_te_workload(name, idx)
            except RuntimeError:  # C2D_WIN_NHWC: TVM 0.27 raises "LEGACY-FLOW triggered"
                continue
            hashes[structural_hash(tvm.IRModule({"main": func}))] = f"{name}[{idx}]"
    return hashes
