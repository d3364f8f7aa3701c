"""NumPy transcriptions of the compressors, written from their papers (not from lightning_fed's code); stochastic
ones take the uniform draws / the permutation as arguments, which the tests take from
``lightning_fed.communication.client_generator`` exactly as documented there."""

from __future__ import annotations

import math

import numpy as np


def qsgd(v, s, u):
    """Alistarh et al. 2017, Sec. 3.1: ‖v‖₂·sgn(v_i)·ξ_i, ξ_i = (l+1)/s w.p. s|v_i|/‖v‖ − l else l/s (drawn as
    l + 1 when u_i ≥ 1 − p_i); the norm sent as float32; bits 32 + d(1 + ⌈log₂(s+1)⌉)."""
    x = v.astype(np.float64)
    nbytes = math.ceil((32 + v.size * (1 + math.ceil(math.log2(s + 1)))) / 8)
    norm = math.sqrt(float(np.sum(x * x)))
    if norm == 0:
        return np.zeros_like(v), nbytes
    r = np.abs(x) / norm * s
    l = np.floor(r)
    xi = (l + (u >= 1 - (r - l))) / s
    sign = np.where(x < 0, -1.0, 1.0)
    return (float(np.float32(norm)) * sign * xi).astype(v.dtype), nbytes


def uniform(v, k):
    """Min-max uniform quantiser: 2^k levels on [float32(min), float32(max)], nearest (half to even)."""
    lo, hi = float(np.float32(v.min())), float(np.float32(v.max()))
    nbytes = math.ceil((64 + v.size * k) / 8)
    if hi == lo:
        return np.full_like(v, lo), nbytes
    step = (hi - lo) / (2 ** k - 1)
    q = np.clip(np.round((v.astype(np.float64) - lo) / step), 0, 2 ** k - 1)
    return (lo + q * step).astype(v.dtype), nbytes


def topk(v, k):
    """Stich et al. 2018, top_k: the k largest |v_i|, lower index first on ties; k values + k int32 indices."""
    order = sorted(range(v.size), key=lambda i: (-abs(float(v[i])), i))[:k]
    out = np.zeros_like(v)
    out[order] = v[order]
    return out, k * (v.itemsize + 4)


def randk(v, k, permutation, unbiased=False):
    """Stich et al. 2018, rand_k (scaled by d/k when unbiased): the first k of ``permutation``."""
    index = np.asarray(permutation[:k])
    out = np.zeros_like(v)
    out[index] = v[index] * (v.size / k if unbiased else 1.0)
    return out, k * (v.itemsize + 4)


def bfloat16(v):
    """float32 → bfloat16 → float32, round to nearest even on the upper 16 bits (finite values)."""
    bits = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)
