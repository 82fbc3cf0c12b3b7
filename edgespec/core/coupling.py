"""Drafter-invariant seeded sampling: the exponential race (Gumbel-max) coupling of the target and the draft.

Daliri, Musco and Suresh 2024, "Coupling without Communication and Drafter-Invariant Speculative Decoding"
(arXiv 2408.07978), Gumbel sampling: the randomness of output position n is a vector of noise over the
vocabulary drawn from (seed, n) alone. The target's token at n is

    x_n = argmax_v  log p_n(v) + G_n(v)   =   argmin_v  E_n(v) / p_n(v),     E_n(v) = -log U_n(v) ~ Exp(1)

(G = -log E is standard Gumbel; the two forms are the same race). Each x_n is an exact sample from p_n, and it
depends on nothing but p_n and (seed, n). The draft proposes argmin_v E_n(v) / q_n(v) with the *same* noise, and
verification accepts a proposal exactly when it equals the target's choice. The output is therefore the same for
plain decoding, any K, any proposer (chain, tree, prompt lookup, suffix), any KV cache state and any drafter; the
acceptance probability per position is at least (1 − TV(p, q)) / (1 + TV(p, q)) (the paper's Theorem 3; the
standard rule of Leviathan et al. 2023 accepts with probability exactly 1 − TV).

The noise comes from a counter-based hash, so any entry is computable on its own and the TypeScript core
(``android_demo/core/src/coupling.ts``) computes the same numbers. With all arithmetic on uint32 (wrapping):

    H(x)   = lowbias32:  x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
             (C. Wellons' "hash prospector", a bijective integer hash)
    b      = H(H(H(seed_lo ^ 0x243f6a88) ^ seed_hi) ^ n),   b2 = H(b ^ 0x13198a2e)
             (seed reduced mod 2^64: seed_lo, seed_hi its low and high 32 bits; n the absolute position in the
             token sequence: the prompt is positions 0..len-1)
    h(v)   = H(v ^ 0x85a308d3)
    w1, w2 = H(b ^ h(v)), H(b2 ^ h(v))
    U_n(v) = ((w1 >> 5) · 2^26 + (w2 >> 6) + 0.5) / 2^53        in (0, 1), 53 bits like a double's mantissa
    E_n(v) = -ln U_n(v)

Ties in the race (probability ~2^-53 per pair) go to the lowest id.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

_M32 = np.uint32(0xFFFFFFFF)


def hash32(x: np.ndarray | int, out_of_place: bool = True) -> np.ndarray:
    """lowbias32 of uint32 values (array or scalar), wrapping uint32 arithmetic; returns uint32 of the same shape
    (``out_of_place`` False: a uint32 array given is overwritten)."""
    x = np.asarray(x, dtype=np.uint32)
    if out_of_place:
        x = x.copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


def position_key(seed: int, n: int) -> tuple[int, int]:
    """The two uint32 words (b, b2) that key the noise of absolute position ``n`` (0 ≤ n < 2^32) for ``seed``."""
    seed = int(seed) % (1 << 64)
    lo, hi = seed & 0xFFFFFFFF, seed >> 32
    b = int(hash32(lo ^ 0x243F6A88))
    b = int(hash32(b ^ hi))
    b = int(hash32(b ^ (int(n) & 0xFFFFFFFF)))
    return b, int(hash32(b ^ 0x13198A2E))


def exponentials(seed: int, n: int, ids: np.ndarray) -> np.ndarray:
    """E_n(v) float64 (len(ids),) for the token ids ``ids`` int (M,) at position ``n`` (the formula above)."""
    b, b2 = position_key(seed, n)
    h = hash32(np.asarray(ids, dtype=np.uint32) ^ np.uint32(0x85A308D3))
    return _exp_from(b, b2, h)


def _exp_from(b: int, b2: int, h: np.ndarray) -> np.ndarray:
    w1 = hash32(h ^ np.uint32(b), out_of_place=False)
    w2 = hash32(h ^ np.uint32(b2), out_of_place=False)
    w1 >>= np.uint32(5)
    w2 >>= np.uint32(6)
    u = w1.astype(np.float64)
    u *= 67108864.0
    u += w2
    u += 0.5
    u *= 1.0 / 9007199254740992.0
    np.log(u, out=u)
    return np.negative(u, out=u)


class GumbelCoupling:
    """The noise of one seeded generation over a vocabulary of ``width`` ids, and the coupled choices.

    ``choose(dist, n)`` is the token at absolute position ``n`` for a distribution ``dist`` float (W,) (the
    target's p or the draft's q, after temperature/top-k/top-p); ``candidates(dist, n, m)`` the ``m`` best
    tokens of the same race (for a tree's children). Noise vectors of the last few positions are kept, so the
    draft's proposal and the target's verify at one position pay for it once (~2 ms for 151k ids here).
    """

    def __init__(self, seed: int, width: int, keep: int = 32):
        self.seed = int(seed) % (1 << 64)
        self.width = int(width)
        self._h = hash32(np.arange(self.width, dtype=np.uint32) ^ np.uint32(0x85A308D3))
        self._full: OrderedDict[int, np.ndarray] = OrderedDict()
        self._keep = keep

    def noise(self, n: int, ids: np.ndarray | None = None) -> np.ndarray:
        """E_n float64: over every id (W,), or over ``ids`` (M,) only."""
        if ids is None:
            e = self._full.get(n)
            if e is None:
                e = self._full[n] = _exp_from(*position_key(self.seed, n), self._h)
                if len(self._full) > self._keep:
                    self._full.popitem(last=False)
            else:
                self._full.move_to_end(n)
            return e
        if n in self._full:
            return self._full[n][ids]
        return _exp_from(*position_key(self.seed, n), self._h[ids])

    def _keys(self, dist: np.ndarray, n: int) -> tuple[np.ndarray | None, np.ndarray]:
        """(ids, race keys E_n / dist over them): ids None means every id (keys inf where dist is 0)."""
        dist = np.asarray(dist)[:self.width]
        nz = int(np.count_nonzero(dist > 0))
        if nz == 0:
            raise ValueError("cannot sample: the distribution has no positive mass")
        if nz * 4 > self.width:  # a broad distribution: the whole cached noise vector, no gather
            with np.errstate(divide="ignore"):
                return None, self.noise(n) / dist
        support = np.flatnonzero(dist > 0)
        return support, self.noise(n, support) / dist[support]

    def choose(self, dist: np.ndarray, n: int) -> int:
        """argmin_v E_n(v) / dist(v) over dist > 0: an exact sample from norm(dist), keyed by (seed, n)."""
        ids, keys = self._keys(dist, n)
        i = int(np.argmin(keys))
        return i if ids is None else int(ids[i])

    def candidates(self, dist: np.ndarray, n: int, m: int) -> list[int]:
        """The ``m`` tokens (at most the support's size) with the smallest race keys, best first; the first is
        :meth:`choose`."""
        ids, keys = self._keys(dist, n)
        if ids is None:
            ids = np.arange(len(keys))
        m = min(m, int(np.isfinite(keys).sum()))
        if m <= 0:
            return []
        top = np.argpartition(keys, m - 1)[:m] if m < len(keys) else np.arange(len(keys))
        top = top[np.lexsort((ids[top], keys[top]))]
        return [int(ids[i]) for i in top]
