#!/usr/bin/env python3
"""NF4 fixtures from bitsandbytes, for test/test_nf4.cu (and checked again by test_nf4.py).

    make test-interop     # once: the pinned virtual environment build/interop-venv
    LD_LIBRARY_PATH=<as test/interop/run.sh sets it> \
        build/interop-venv/bin/python test/interop/make_nf4_fixtures.py [OUT_DIR | --cpp-tables]

(--cpp-tables prints the tables of kernels/nf4.cuh as C++ hex literals.) The output is the same
on every run; test_nf4.py checks that the committed files are what the pinned versions give.

bitsandbytes 0.50.2 quantises on the CPU here (its `default` torch kernel for quantize_4bit, its
native CPU library for the 8-bit blockwise quantisation of double quantisation and for
dequantisation). Its CUDA kernels cannot run here; where they decide differently from the CPU
path, this script emulates them from their source (csrc/kernels.cu: dQuantizeNF4, dQuantize,
kQuantizeBlockwise) and writes what they would give beside what the CPU gave.

Where the CPU and CUDA paths differ (every difference found, by reading both and by comparing
them on these cases):
  1. 4-bit thresholds. CUDA compares x/absmax against 15 decimal literals (a decision tree), which
     the compiler rounds to float; the CPU compares against (level[i] + level[i+1]) / 2 computed
     in float32 (round to nearest even). The two differ by one float for 4 of the 15 thresholds
     (0, 8, 12, 14), so exactly one float value of x/absmax per threshold gets a different code.
  2. All-zero block. The CPU clamps the absmax used for the reciprocal to 1e-38, so x/absmax = 0
     and the code is 7 (level 0.0); CUDA computes 0 * (1/0) = NaN, which its tree sends to code 0
     (level -1.0). Without double quantisation both dequantise to 0 (times absmax 0); with it
     the dequantised absmax is not exactly 0 and CUDA's block becomes -absmax'.
  3. All-zero partial last block: the CPU also STORES the clamped absmax (1e-38); CUDA stores 0.
  4. Partial last block: the CPU scales by x / absmax, every other block (and CUDA) by
     x * (1 / absmax); the two can differ by an ulp and so, at a threshold, by one code.
  5. 8-bit search of double quantisation. CUDA binary-searches the 256-entry dynamic map and
     picks the nearer neighbour by comparing with (a + b) * 0.5f; the CPU rounds x to a grid of
     65536 points in [-1, 1] and looks the code up in a table built for the grid, so codes within
     half a grid step of a midpoint can be one off.
  Not emulated (it cannot be, on any machine but the GPU it ran on): bitsandbytes builds its CUDA
  kernels with --use_fast_math, so 1.0f / absmax there is the approximate reciprocal (within an
  ulp), and denormal inputs are flushed to zero; and torch on CUDA forms the mean of the absmaxes
  in another order (the CPU's is the correctly rounded sum, see below, divided by the count).

polevault's rule (kernels/nf4.cuh): the CUDA kernels' decisions (1, 4, 5 as CUDA) with IEEE
arithmetic, except an all-zero block, which is code 7 with absmax 0 (2 and 3 as the CPU's codes,
CUDA's absmax). For each case the script writes what polevault must produce, computed here from
that rule and, for dequantisation, by bitsandbytes' own dequantize_4bit on polevault's fields,
and the index lists of every element where bitsandbytes (CPU, or emulated CUDA) differs from it,
each list named by its reason above; the script fails on any difference it cannot explain.

A bitsandbytes 0.50.2 CPU bug the cases avoid: on a CPU with AVX-512 its dequantize_4bit of a
2-D tensor whose last dimension is a multiple of 16 but not of 64 indexes the absmaxes per row
(a 4 x 80 bf16 tensor: 88 of 320 values wrong); its quantisation is right. The 2-D case here has
832 columns (as real weights, a multiple of 64); the others are 1-D.

The offset of double quantisation is torch's `absmax.mean()`: on the CPU a float32 sum then a
division by the count. The script checks that it equals the correctly rounded sum divided by the
count (exact rational arithmetic here), which is what polevault computes, on every case.

Output, OUT_DIR (default test/data/nf4/):
  tables.safetensors    nf4_levels F32[16] (bitsandbytes' NF4 table), nf4_thresholds_cuda
                        F32[15] (the tree's literals as the compiler rounds them),
                        nf4_thresholds_cpu F32[15], dynamic_map F32[256]
                        (create_dynamic_map(signed=True)); nf4_probe, dynamic_probe F32[k]:
                        values at and next to every threshold, level, map entry and midpoint,
                        with nf4_probe_cuda_code, dynamic_probe_cuda_code U8[k]: the codes the
                        CUDA kernels' searches give them
  CASE.safetensors      one tensor of awkward size (metadata: description, versions), with
    input                    the tensor given to quantize_4bit (its own shape, BF16 or F32)
    cpu/codes U8, cpu/absmax F32, cpu/dequant           compress_statistics=False, CPU
    cpu_dq/absmax_codes U8, cpu_dq/nested_absmax F32, cpu_dq/offset F32[1], cpu_dq/dequant
                                                        compress_statistics=True, CPU (its codes
                                                        equal cpu/codes; the script checks)
    polevault/codes, polevault/absmax, polevault/dequant,
    polevault_dq/absmax_codes, polevault_dq/nested_absmax, polevault_dq/offset,
    polevault_dq/dequant                                polevault's rule, each stored only when it
                                                        differs from the cpu/ or cpu_dq/ tensor of
                                                        the same name (else that one is expected)
    cuda/codes, cuda_dq/dequant                         the CUDA kernels, emulated, where they
                                                        differ from polevault's (all-zero blocks;
                                                        their other fields are polevault's)
    diff/cpu/<reason>, diff/cuda/<reason>  I64 indices (of elements for codes, of blocks for
                        absmax and absmax_codes) where bitsandbytes differs from polevault, one
                        list per reason, absent when empty: cpu/codes_threshold (1 above),
                        cpu/codes_division (4), cpu/absmax_zero_tail (3), cpu/absmax_codes_search
                        (5), cuda/codes_zero_block (2); the metadata counts each
  The dequantised values are in the input's dtype, as bitsandbytes returns them.
"""

import json
import os
import struct
import sys
from fractions import Fraction

import numpy as np
import torch

import bitsandbytes
import bitsandbytes.functional as bnbf

BLOCK = 64
NESTED_BLOCK = 256
CODE_OF_ZERO = 7  # the NF4 level 0.0

# csrc/kernels.cu, dQuantizeNF4: the decision tree's thresholds in increasing order, as written
# in the source (decimal literals with an f suffix).
CUDA_NF4_THRESHOLD_LITERALS = [
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011",
]


def f32(v):
    return np.float32(v)


def f32_bits(v):
    return int(np.array([v], dtype=np.float32).view(np.uint32)[0])


def decimal_to_f32(text):
    """A decimal literal rounded once to float32 (nearest, ties to even), as a C++ compiler does."""
    q = Fraction(text)
    f = f32(float(q))
    candidates = [np.nextafter(f, f32(-np.inf)), f, np.nextafter(f, f32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - q), f32_bits(c) & 1))


NF4_LEVELS = bnbf.get_4bit_type("nf4", device="cpu").numpy().astype(np.float32)
DYNAMIC_MAP = bnbf.create_dynamic_map(signed=True).numpy().astype(np.float32)
CUDA_THRESHOLDS = np.array([decimal_to_f32(t) for t in CUDA_NF4_THRESHOLD_LITERALS], dtype=np.float32)
CPU_THRESHOLDS = ((torch.from_numpy(NF4_LEVELS[:-1]) + torch.from_numpy(NF4_LEVELS[1:])) / 2).numpy()


# ---- the CUDA kernels' rules, emulated ----------------------------------------------------------


def cuda_nf4_code(s):
    """dQuantizeNF4: the tree returns how many thresholds s exceeds (s > t); NaN exceeds none."""
    return int(np.count_nonzero(s > CUDA_THRESHOLDS))


def cuda_dynamic_code(s):
    """dQuantize<0> over the 256-entry map: a binary search of 7 halving steps from the middle
    entry, then the nearer of the final entry and its neighbour on s's side, judged against their
    float32 midpoint (a + b) * 0.5f; s equal to that midpoint keeps the final entry."""
    code = DYNAMIC_MAP
    pivot, lower_pivot, upper_pivot = 127, 0, 255
    lower, upper = f32(-1.0), f32(1.0)
    value = code[pivot]
    step = 64
    while step > 0:
        if s > value:
            lower_pivot, lower = pivot, value
            pivot += step
        else:
            upper_pivot, upper = pivot, value
            pivot -= step
        value = code[pivot]
        step //= 2
    if upper_pivot == 255:
        upper = code[255]
    if lower_pivot == 0:
        lower = code[0]
    if s > value:
        midpoint = f32(f32(upper + value) * f32(0.5))
        return upper_pivot if s > midpoint else pivot
    midpoint = f32(f32(lower + value) * f32(0.5))
    return lower_pivot if s < midpoint else pivot


def block_absmax(x):
    n = x.size
    return np.array([np.max(np.abs(x[b : b + BLOCK])) for b in range(0, n, BLOCK)], dtype=np.float32)


def quantize_4bit(x, zero_block_code):
    """Codes (one per element, plus a padding element of value 0 when n is odd) and absmaxes by
    the CUDA rule: s = x * (1 / absmax) in float32, code = cuda_nf4_code(s). An all-zero block gets
    `zero_block_code` for every element: None for CUDA's own result (NaN -> 0)."""
    n = x.size
    absmax = block_absmax(x)
    padded = np.concatenate([x, np.zeros(n % 2, dtype=np.float32)])
    codes = np.empty(padded.size, dtype=np.uint8)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(padded.size):
            a = absmax[i // BLOCK]
            if a == 0 and zero_block_code is not None:
                codes[i] = zero_block_code
            else:
                codes[i] = cuda_nf4_code(padded[i] * (f32(1.0) / a))
    return codes, absmax


def pack(codes):
    return ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)


def unpack(packed, n):
    codes = np.empty(packed.size * 2, dtype=np.uint8)
    codes[0::2] = packed >> 4
    codes[1::2] = packed & 0xF
    return codes[:n]


def correctly_rounded_mean(absmax):
    """fl(fl(sum) / count): the exact sum rounded once to float32, divided in float32."""
    exact = sum(Fraction(float(a)) for a in absmax)
    total = decimal_to_f32(exact)
    return f32(total / f32(len(absmax)))


def quantize_nested(absmax, offset):
    """Double quantisation by the CUDA rule: v = absmax - offset; per block of 256, m = max |v|,
    code = cuda_dynamic_code(v * (1 / m)); m = 0 gives NaN, which the search sends to code 0."""
    v = (absmax - offset).astype(np.float32)
    codes = np.empty(v.size, dtype=np.uint8)
    nested = []
    for b in range(0, v.size, NESTED_BLOCK):
        m = np.max(np.abs(v[b : b + NESTED_BLOCK]))
        nested.append(m)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = f32(1.0) / m
            for i in range(b, min(b + NESTED_BLOCK, v.size)):
                codes[i] = cuda_dynamic_code(f32(v[i] * r))
    return codes, np.array(nested, dtype=np.float32)


# ---- bitsandbytes itself --------------------------------------------------------------------------


def bnb_dequantize(packed, absmax, shape, dtype, nested=None):
    """bitsandbytes' dequantize_4bit on given fields (nested: (absmax_codes, nested_absmax, offset))."""
    code = bnbf.get_4bit_type("nf4", device="cpu")
    if nested is None:
        state = bnbf.QuantState(absmax=torch.from_numpy(absmax), shape=shape, code=code, blocksize=BLOCK,
                                quant_type="nf4", dtype=dtype)
    else:
        absmax_codes, nested_absmax, offset = nested
        state2 = bnbf.QuantState(absmax=torch.from_numpy(nested_absmax), code=torch.from_numpy(DYNAMIC_MAP),
                                 blocksize=NESTED_BLOCK, dtype=torch.float32)
        state = bnbf.QuantState(absmax=torch.from_numpy(absmax_codes), shape=shape, code=code, blocksize=BLOCK,
                                quant_type="nf4", dtype=dtype, offset=torch.tensor(offset), state2=state2)
    return bnbf.dequantize_4bit(torch.from_numpy(packed).reshape(-1, 1), state)


def indices(mask):
    return np.nonzero(mask)[0].astype(np.int64)


def make_case(x):
    """Every fixture tensor of one input tensor x (torch, bf16 or fp32)."""
    n = x.numel()
    xf = x.reshape(-1).float().numpy()
    out = {"input": x.contiguous()}

    # bitsandbytes on the CPU.
    packed, st = bnbf.quantize_4bit(x, blocksize=BLOCK, compress_statistics=False, quant_type="nf4")
    packed_dq, st_dq = bnbf.quantize_4bit(x, blocksize=BLOCK, compress_statistics=True, quant_type="nf4")
    assert torch.equal(packed, packed_dq), "the 4-bit codes do not depend on compress_statistics"
    cpu_codes = unpack(packed.reshape(-1).numpy(), n + n % 2)
    cpu_absmax = st.absmax.numpy()
    out["cpu/codes"] = packed.reshape(-1)  # cpu_dq/codes: the same bytes
    out["cpu/absmax"] = st.absmax
    out["cpu/dequant"] = bnbf.dequantize_4bit(packed, st).reshape(-1)
    out["cpu_dq/absmax_codes"] = st_dq.absmax
    out["cpu_dq/nested_absmax"] = st_dq.state2.absmax
    out["cpu_dq/offset"] = st_dq.offset.reshape(1)
    out["cpu_dq/dequant"] = bnbf.dequantize_4bit(packed_dq, st_dq).reshape(-1)
    torch_offset = f32(st_dq.offset.item())
    assert torch_offset == correctly_rounded_mean(cpu_absmax), "torch's mean is not fl(fl(sum)/n) here"

    # The CUDA kernels, and polevault.
    cuda_codes, absmax = quantize_4bit(xf, zero_block_code=None)
    pv_codes, _ = quantize_4bit(xf, zero_block_code=CODE_OF_ZERO)
    offset = correctly_rounded_mean(absmax)
    assert offset == torch_offset, "the zero tail's absmax (1e-38 vs 0) moved the mean"
    absmax_codes, nested_absmax = quantize_nested(absmax, offset)
    pv_packed = pack(pv_codes)
    nested = (absmax_codes, nested_absmax, offset)
    polevault = {
        "polevault/codes": torch.from_numpy(pv_packed),
        "polevault/absmax": torch.from_numpy(absmax),
        "polevault/dequant": bnb_dequantize(pv_packed, absmax, x.shape, x.dtype).reshape(-1),
        "polevault_dq/absmax_codes": torch.from_numpy(absmax_codes),
        "polevault_dq/nested_absmax": torch.from_numpy(nested_absmax),
        "polevault_dq/offset": torch.tensor([offset], dtype=torch.float32),
        "polevault_dq/dequant": bnb_dequantize(pv_packed, absmax, x.shape, x.dtype, nested).reshape(-1),
    }
    for name, t in polevault.items():  # stored only where they differ from bitsandbytes' CPU result
        if not torch.equal(t.view(torch.uint8), out[name.replace("polevault", "cpu")].view(torch.uint8)):
            out[name] = t
    if not np.array_equal(cuda_codes, pv_codes):  # CUDA's fields are polevault's but for these codes
        cuda_packed = pack(cuda_codes)
        out["cuda/codes"] = torch.from_numpy(cuda_packed)
        out["cuda_dq/dequant"] = bnb_dequantize(cuda_packed, absmax, x.shape, x.dtype, nested).reshape(-1)
    assert np.array_equal(st_dq.state2.absmax.numpy(), nested_absmax), "nested absmax: CPU and CUDA agree"

    # Where bitsandbytes differs from polevault, and why; anything unexplained is an error.
    zero_block = absmax[np.arange(n + n % 2) // BLOCK] == 0
    reciprocal = np.float32(1.0) / np.where(absmax == 0, np.float32(1), absmax)
    padded = np.concatenate([xf, np.zeros(n % 2, dtype=np.float32)])
    s = (padded * reciprocal[np.arange(padded.size) // BLOCK]).astype(np.float32)
    differing_thresholds = CPU_THRESHOLDS[CPU_THRESHOLDS != CUDA_THRESHOLDS]
    at_threshold = np.isin(s, differing_thresholds) | np.isin(s, CUDA_THRESHOLDS[CPU_THRESHOLDS != CUDA_THRESHOLDS])
    last = (n - 1) // BLOCK
    tail_start = last * BLOCK
    in_partial_tail = (np.arange(padded.size) >= tail_start) & (n % BLOCK != 0)
    divided = padded / np.float32(max(absmax[last], np.float32(1e-38)))
    division_differs = in_partial_tail & (divided != s)

    diffs = {}
    code_diff = cpu_codes != pv_codes
    explained = at_threshold | division_differs
    assert not np.any(code_diff & ~explained), f"unexplained CPU code differences at {indices(code_diff & ~explained)}"
    diffs["diff/cpu/codes_threshold"] = indices(code_diff & at_threshold)
    diffs["diff/cpu/codes_division"] = indices(code_diff & division_differs & ~at_threshold)
    absmax_diff = cpu_absmax != absmax
    zero_tail = (absmax == 0) & (np.arange(absmax.size) == last) & (n % BLOCK != 0)
    assert not np.any(absmax_diff & ~zero_tail), "unexplained CPU absmax differences"
    diffs["diff/cpu/absmax_zero_tail"] = indices(absmax_diff)
    nested_diff = st_dq.absmax.numpy() != absmax_codes
    diffs["diff/cpu/absmax_codes_search"] = indices(nested_diff)
    cuda_diff = cuda_codes != pv_codes
    assert not np.any(cuda_diff & ~zero_block), "polevault's codes differ from CUDA's outside all-zero blocks"
    diffs["diff/cuda/codes_zero_block"] = indices(cuda_diff)
    for name, idx in diffs.items():
        if idx.size:
            out[name] = torch.from_numpy(idx)
    return out, {k: int(v.size) for k, v in diffs.items()}


# ---- the cases ------------------------------------------------------------------------------------


def bf16(t):
    return t.to(torch.bfloat16)


def case_short_tail(g):
    """2582 elements (40 blocks and 22): weight-like values, a length not a multiple of 64."""
    return bf16(torch.randn(2582, generator=g) * 0.02)


def case_odd(g):
    """777 elements: an odd length (the last byte's low nibble is padding) and a 9-element tail."""
    return bf16(torch.randn(777, generator=g))


def case_many_blocks(g):
    """A 24 x 832 weight with one outlier (as LLM weights have): 312 blocks, so double quantisation
    has a full and a partial nested block, and the absmaxes minus their mean are small against the
    outlier's, where the CPU's 8-bit lookup is coarse."""
    x = torch.randn(24, 832, generator=g) * 0.02
    x[5, 100] = 1.0
    return bf16(x)


def case_zero_blocks(g):
    """808 elements: block 5 all zero, the 40-element partial last block all zero, block 2 with a
    single non-zero element."""
    x = torch.randn(808, generator=g)
    x[5 * BLOCK : 6 * BLOCK] = 0
    x[12 * BLOCK :] = 0
    x[2 * BLOCK : 3 * BLOCK] = 0
    x[2 * BLOCK + 17] = -0.75
    return bf16(x)


def case_magnitudes(g):
    """2557 elements: each block at a random scale from 2^-120 to 2^120 (bf16 has float32's range),
    one block mixing 2^100 with 2^-100 (the small ones quantise to 0), and denormal elements."""
    blocks = (2557 + BLOCK - 1) // BLOCK
    scale = torch.pow(2.0, torch.randint(-120, 121, (blocks,), generator=g).double())
    x = torch.randn(blocks * BLOCK, generator=g, dtype=torch.float64) * scale.repeat_interleave(BLOCK)
    x[7 * BLOCK : 8 * BLOCK] = torch.randn(BLOCK, generator=g, dtype=torch.float64) * 2.0**-100
    x[7 * BLOCK + 3] = 2.0**100
    x[9 * BLOCK + 5] = 3 * 2.0**-133  # denormal in bf16 and float32
    return bf16(x[:2557])


def case_dq_search(g):
    """float32, 96 blocks whose absmaxes sit about their mean (one block at 2, one at 2^-20, the
    rest 1 + e), so double quantisation's scaled values are spread over [-1, 1] and, for half the
    blocks, within 1e-4 of 0, where the map's codes are closer together than the CPU's lookup grid."""
    blocks = 96
    e = torch.rand(blocks, generator=g, dtype=torch.float64) * 2 - 1
    e[blocks // 2 :] *= 1e-4
    absmax = 1 + e
    absmax[0], absmax[1] = 2.0, 2.0**-20
    x = (torch.rand(blocks, BLOCK, generator=g, dtype=torch.float64) * 2 - 1) * absmax[:, None]
    x[:, 0] = absmax * torch.where(torch.rand(blocks, generator=g) < 0.5, -1.0, 1.0)
    return x.reshape(-1).float()


def division_splits(g):
    """An absmax a and values x for which x / a (the CPU's partial last block) and x * (1 / a)
    (every other block, and CUDA) fall on either side of a threshold the two paths share."""
    shared = CUDA_THRESHOLDS[CUDA_THRESHOLDS == CPU_THRESHOLDS]
    while True:
        a = f32(0.5 + torch.rand(1, generator=g).item())
        r = f32(1.0) / a
        found = []
        for t in shared:
            x = f32(t * a)
            for _ in range(3):
                x = np.nextafter(x, f32(-np.inf))
            for _ in range(7):
                if (f32(x / a) > t) != (f32(x * r) > t):
                    found.append(x)
                x = np.nextafter(x, f32(np.inf))
        if len(found) >= 2:
            return a, found


def case_ties_fp32(g):
    """float32, 317 elements: four blocks with absmax exactly 1 holding each threshold of both
    paths, the floats next to them and every level; a partial last block whose absmax a makes
    x / a and x * (1 / a) straddle a threshold for some x, which it holds; random values."""
    values = []
    for t in np.concatenate([CUDA_THRESHOLDS, CPU_THRESHOLDS]):
        values += [np.nextafter(t, f32(-np.inf)), t, np.nextafter(t, f32(np.inf))]
    values += list(NF4_LEVELS)
    values = np.unique(np.array(values, dtype=np.float32))
    rest = torch.rand(4 * BLOCK, generator=g).numpy().astype(np.float32) * 2 - 1
    body = np.concatenate([values, rest])
    out = []
    for b in range(4):
        out += [f32(1.0)] + list(body[b * (BLOCK - 1) : (b + 1) * (BLOCK - 1)])
    a, splits = division_splits(g)
    tail = torch.rand(61 - 1 - len(splits), generator=g).numpy().astype(np.float32) * 2 - 1
    out += [-a] + splits + list(tail * a)
    return torch.from_numpy(np.array(out, dtype=np.float32))


CASES = {
    "short_tail": case_short_tail,
    "odd": case_odd,
    "many_blocks": case_many_blocks,
    "zero_blocks": case_zero_blocks,
    "magnitudes": case_magnitudes,
    "dq_search": case_dq_search,
    "ties_fp32": case_ties_fp32,
}


def around(values):
    """Each value and the floats on either side of it."""
    out = []
    for v in values:
        out += [np.nextafter(v, f32(-np.inf)), v, np.nextafter(v, f32(np.inf))]
    return np.array(out, dtype=np.float32)


def probes():
    """Scaled values at and next to every decision boundary of both searches, with the codes the
    CUDA kernels give them (NaN included: both searches send it to code 0)."""
    extremes = np.array([-2, -1, 0, 1, 2, np.nan], dtype=np.float32)
    nf4 = np.concatenate([around(np.concatenate([CUDA_THRESHOLDS, CPU_THRESHOLDS, NF4_LEVELS])), extremes])
    midpoints = ((DYNAMIC_MAP[:-1] + DYNAMIC_MAP[1:]) * f32(0.5)).astype(np.float32)
    dynamic = np.concatenate([around(np.concatenate([midpoints, DYNAMIC_MAP])), extremes])
    return {
        "nf4_probe": torch.from_numpy(nf4),
        "nf4_probe_cuda_code": torch.tensor([cuda_nf4_code(v) for v in nf4], dtype=torch.uint8),
        "dynamic_probe": torch.from_numpy(dynamic),
        "dynamic_probe_cuda_code": torch.tensor([cuda_dynamic_code(v) for v in dynamic], dtype=torch.uint8),
    }


def make_all():
    """name -> (tensors, metadata) for every case, and the tables."""
    versions = f"bitsandbytes {bitsandbytes.__version__}, torch {torch.__version__}"
    files = {
        "tables": (
            {
                "nf4_levels": torch.from_numpy(NF4_LEVELS),
                "nf4_thresholds_cuda": torch.from_numpy(CUDA_THRESHOLDS),
                "nf4_thresholds_cpu": torch.from_numpy(CPU_THRESHOLDS),
                "dynamic_map": torch.from_numpy(DYNAMIC_MAP),
                **probes(),
            },
            {"source": versions},
        )
    }
    for seed, (name, make) in enumerate(CASES.items()):
        g = torch.Generator().manual_seed(1400 + seed)
        x = make(g)
        tensors, counts = make_case(x)
        meta = {"description": " ".join(make.__doc__.split()), "source": versions,
                "shape": "x".join(str(d) for d in x.shape), "dtype": str(x.dtype).replace("torch.", "")}
        meta.update({k: str(v) for k, v in counts.items()})
        files[name] = (tensors, meta)
    return files


def cpp_tables():
    """The tables of kernels/nf4.cuh, as C++ hex float literals."""
    def literal(v):
        mantissa, exponent = float(v).hex().split("p")
        return f"{mantissa.rstrip('0').rstrip('.')}p{exponent}f"

    def rows(values, per_row):
        text = [literal(v) for v in values]
        return "\n".join("    " + ", ".join(text[i : i + per_row]) + "," for i in range(0, len(text), per_row))

    return (f"levels:\n{rows(NF4_LEVELS, 4)}\nthresholds (CUDA):\n{rows(CUDA_THRESHOLDS, 4)}\n"
            f"dynamic map:\n{rows(DYNAMIC_MAP, 6)}")


SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.int64: "I64"}


def save_sorted(path, tensors, metadata):
    """A safetensors file with its header's keys and its tensors in sorted order, so the same
    fixtures are the same bytes (safetensors' own writer orders the metadata at random)."""
    header, blobs, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # the buffer starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(argv):
    if argv[1:2] == ["--cpp-tables"]:
        print(cpp_tables())
        return
    out_dir = argv[1] if len(argv) > 1 else "test/data/nf4"
    os.makedirs(out_dir, exist_ok=True)
    for name, (tensors, meta) in make_all().items():
        path = os.path.join(out_dir, f"{name}.safetensors")
        save_sorted(path, tensors, meta)
        diffs = {k: v for k, v in meta.items() if k.startswith("diff/") and v != "0"}
        print(f"{path}: {os.path.getsize(path)} bytes; differences: {diffs or 'none'}")


if __name__ == "__main__":
    main(sys.argv)
