"""Held-out per-client evaluation data: the seeded split of every client's share, vectorised over the population.

:func:`split_client_eval` splits one client's indices; :func:`split_partition_eval` gives the same split for every
client of a :class:`~lightning_fed.datamodules.partition.Partition` at once — the same draws, bit for bit, without
building one ``numpy.random.Generator`` per client: client ``c``'s generator is
``numpy.random.default_rng([*entropy, c])``, whose seeding (NumPy's ``SeedSequence`` hash and the PCG64 seeding
step) :func:`pcg64_states` computes for all clients in a few array operations.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar, Optional, Sequence, Union

import numpy as np

from lightning_fed.checks import check_choice, check_int
from lightning_fed.datamodules.partition import Partition

# NumPy's SeedSequence constants (numpy/random/bit_generator.pyx) and PCG64's 128-bit LCG multiplier.
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL_SIZE = 4
_M32 = 0xFFFFFFFF
_M128 = (1 << 128) - 1
_PCG64_MULT = 0x2360ED051FC65DA44385DF649FCCF645


def _uint32_words(value: int) -> list[int]:
    """A non-negative int as NumPy's SeedSequence reads it: little-endian 32-bit words, ``[0]`` for 0."""
    value = int(value)
    if value < 0:
        raise ValueError(f"seed entropy must be non-negative, got {value}.")
    words = []
    while True:
        words.append(value & _M32)
        value >>= 32
        if not value:
            return words


def _pcg64_seed_words(entropy: Sequence[int], ids: np.ndarray) -> np.ndarray:
    """uint64 ``[n, 4]``: ``SeedSequence([*entropy, i]).generate_state(4, np.uint64)`` for every ``i`` in ``ids``
    (PCG64's 128-bit seed is words 0-1, its sequence words 2-3, most significant first)."""
    ids = np.asarray(ids).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() > _M32):
        raise ValueError("`ids` must lie in [0, 2**32).")
    n = ids.size
    cols = [np.full(n, w, dtype=np.uint32) for v in entropy for w in _uint32_words(v)]
    cols.append(ids.astype(np.uint32))
    hash_const = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal hash_const
        value = value ^ np.uint32(hash_const)
        hash_const = (hash_const * _MULT_A) & _M32
        value = value * np.uint32(hash_const)
        return value ^ (value >> np.uint32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = np.uint32(_MIX_MULT_L) * x - np.uint32(_MIX_MULT_R) * y
        return result ^ (result >> np.uint32(16))

    zeros = np.zeros(n, dtype=np.uint32)
    mixer = [hashmix(cols[i] if i < len(cols) else zeros) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                mixer[dst] = mix(mixer[dst], hashmix(mixer[src]))
    for src in range(_POOL_SIZE, len(cols)):
        for dst in range(_POOL_SIZE):
            mixer[dst] = mix(mixer[dst], hashmix(cols[src]))
    hash_const = _INIT_B
    words = []
    for i in range(2 * 4):  # generate_state(4, np.uint64): 8 uint32 words, two to a little-endian uint64
        value = mixer[i % _POOL_SIZE] ^ np.uint32(hash_const)
        hash_const = (hash_const * _MULT_B) & _M32
        value = value * np.uint32(hash_const)
        words.append(value ^ (value >> np.uint32(16)))
    return np.ascontiguousarray(np.stack(words, axis=1).astype("<u4")).view("<u8").astype(np.uint64)


def pcg64_states(entropy: Sequence[int], ids: np.ndarray) -> list[tuple[int, int]]:
    """The PCG64 ``(state, inc)`` of ``numpy.random.default_rng([*entropy, i])`` for every ``i`` in ``ids``.

    Args:
        entropy: non-negative ints, the seed's fixed prefix (e.g. ``[seed, tag]``).
        ids: non-negative ints below 2**32, shape ``[n]``.

    Returns:
        ``n`` pairs of Python ints, for ``PCG64.state = {"bit_generator": "PCG64", "state": {"state": s,
        "inc": i}, "has_uint32": 0, "uinteger": 0}``.

    Raises:
        ValueError: a negative value, or an id of 2**32 or more.

    Example::

        >>> s, i = pcg64_states([0, 7], np.array([3]))[0]
        >>> s == np.random.default_rng([0, 7, 3]).bit_generator.state["state"]["state"]
        True
    """
    # the 128-bit seed and sequence (words 0-1, 2-3) as big-endian bytes: int.from_bytes is the fast way to Python ints
    raw = _pcg64_seed_words(entropy, ids).astype(">u8").tobytes()
    from_bytes = int.from_bytes
    states = []
    for at in range(0, len(raw), 32):  # pcg64_set_seed: state 0, inc = 2·seq + 1, step, add the seed, step
        inc = ((from_bytes(raw[at + 16:at + 32], "big") << 1) | 1) & _M128
        states.append((((inc + from_bytes(raw[at:at + 16], "big")) * _PCG64_MULT + inc) & _M128, inc))
    return states


# 128-bit arithmetic on (hi, lo) pairs of uint64 arrays (NumPy's uint64 array arithmetic wraps modulo 2**64).
_U32, _U63, _U58, _U1 = np.uint64(32), np.uint64(63), np.uint64(58), np.uint64(1)
_LO32 = np.uint64(_M32)
# a pass of the vectorised draw-and-swap loops, per draw of the client with the most (µs; see _stratified_held)
_PASS_COST_US = 70.0


def _mul_hi64(a: np.ndarray, b: int) -> np.ndarray:
    """The upper 64 bits of ``a * b`` (``a`` uint64 array, ``b`` a constant below 2**64)."""
    a0, a1 = a & _LO32, a >> _U32
    b0, b1 = np.uint64(b & _M32), np.uint64(b >> 32)
    low, cross_a, cross_b = a0 * b0, a0 * b1, a1 * b0
    mid = (low >> _U32) + (cross_a & _LO32) + (cross_b & _LO32)
    return a1 * b1 + (cross_a >> _U32) + (cross_b >> _U32) + (mid >> _U32)


def _pcg64_step(
    hi: np.ndarray, lo: np.ndarray, inc_hi: np.ndarray, inc_lo: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """PCG64's LCG step, ``state · multiplier + inc`` modulo 2**128."""
    m_hi, m_lo = _PCG64_MULT >> 64, _PCG64_MULT & ((1 << 64) - 1)
    new_hi = _mul_hi64(lo, m_lo) + lo * np.uint64(m_hi) + hi * np.uint64(m_lo)
    new_lo = lo * np.uint64(m_lo)
    out_lo = new_lo + inc_lo
    return new_hi + inc_hi + (out_lo < new_lo).astype(np.uint64), out_lo


def _pcg64_output(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """PCG64's XSL-RR output of a state: ``(hi ^ lo)`` rotated right by ``hi >> 58``."""
    x, rot = hi ^ lo, hi >> _U58
    return (x >> rot) | (x << ((np.uint64(64) - rot) & _U63))


def _pcg64_initial(entropy: Sequence[int], ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(state_hi, state_lo, inc_hi, inc_lo)``, uint64 ``[n]``: :func:`pcg64_states` as arrays."""
    words = _pcg64_seed_words(entropy, ids)
    seq_hi, seq_lo = words[:, 2], words[:, 3]
    inc_hi, inc_lo = (seq_hi << _U1) | (seq_lo >> _U63), (seq_lo << _U1) | _U1
    lo = inc_lo + words[:, 1]  # pcg64_set_seed: state 0, step (state = inc), add the seed, step
    hi = inc_hi + words[:, 0] + (lo < inc_lo).astype(np.uint64)
    hi, lo = _pcg64_step(hi, lo, inc_hi, inc_lo)
    return hi, lo, inc_hi, inc_lo


def _stratified_held(
    partition: Partition, k: np.ndarray, entropy: Sequence[int], pass_cost_us: float = _PASS_COST_US
) -> np.ndarray:
    """bool ``[len(partition.indices)]``: the samples :func:`_held_out` holds out of every client with ``k > 0``,
    stratified by ``partition.labels``, with client ``c``'s generator ``default_rng([*entropy, c])`` — the same
    draws, bit for bit, for the whole population at once.

    :func:`_held_out` gives each class of a client its quota (largest remainders), then calls
    ``rng.permutation(m)`` for each class in increasing label order (m its members; every class, also those of
    quota 0) and holds out the members at the permutation's first ``quota`` places. ``Generator.permutation(m)``
    shuffles ``arange(m)`` by Fisher-Yates: for ``i = m − 1, …, 1`` it swaps places ``i`` and ``j``, ``j`` drawn
    by ``random_interval(i)``: the next 32-bit output masked to the bit length of ``i``, redrawn while above ``i``.
    PCG64 gives its 32-bit outputs as the low then the high half of each 64-bit output. Every draw, accepted or
    not, takes one 32-bit output, so all clients are at the same place of their streams after ``r`` draws: draw
    ``r`` is done for every client still drawing at once, then the swaps, place ``i`` of every class at once.
    Clients with many draws (which would keep these loops going for few clients) draw with one ``Generator``
    re-pointed at each, as :func:`_held_out` does.
    """
    sizes, offsets, flat, labels = partition.sizes(), partition.offsets, partition.indices, partition.labels
    held = np.zeros(flat.size, dtype=bool)
    drawn = np.flatnonzero(k > 0)
    if not drawn.size:
        return held
    n_c, k_c = sizes[drawn], k[drawn]
    # positions (into flat) of the drawn clients' samples, client by client; then by (client, label), stable
    owner = np.repeat(np.arange(drawn.size, dtype=np.int64), n_c)
    pos = np.arange(flat.size) if drawn.size == sizes.size else np.flatnonzero(np.repeat(k > 0, sizes))
    y = labels[flat[pos]]
    span = int(y.max()) + 1
    if drawn.size * span < 2**62:  # one int key, a stable sort (~3× faster than lexsort)
        order = np.argsort(owner * span + y, kind="stable")
    else:
        order = np.lexsort((y, owner))
    pos, y, owner = pos[order], y[order], owner[order]
    del order
    # the (client, class) pairs: their first place in that order, size m, client
    starts = np.flatnonzero(np.r_[True, (owner[1:] != owner[:-1]) | (y[1:] != y[:-1])])
    m = np.diff(np.r_[starts, owner.size])
    pc = owner[starts]
    del y, owner
    pair_first = np.searchsorted(pc, np.arange(drawn.size + 1))  # client c's pairs: pair_first[c]:pair_first[c+1]
    num_classes = np.diff(pair_first)
    # quotas: ⌊k·m/n + 1e-9⌋, then the k − Σ left to the largest remainders (ties: smaller class), as _held_out
    exact = k_c[pc] * m / n_c[pc]
    quota = np.floor(exact + 1e-9).astype(np.int64)
    left = k_c - np.add.reduceat(quota, pair_first[:-1])
    limit = np.where(left >= 0, left, np.maximum(num_classes + left, 0))  # argsort(...)[:left], for any sign
    neg_rem = -(exact - quota)
    if num_classes.max() <= 32:  # rank = the client's pairs before it in a stable sort by neg_rem: d apart at a time
        rank = np.zeros(pc.size, dtype=np.int64)
        for d in range(1, int(num_classes.max())):
            same = pc[d:] == pc[:-d]
            rank[:-d] += same & (neg_rem[d:] < neg_rem[:-d])  # a later class before it: strictly smaller
            rank[d:] += same & (neg_rem[:-d] <= neg_rem[d:])  # an earlier class before it: smaller or equal
        quota[rank < limit[pc]] += 1
    else:
        by_rem = np.lexsort((neg_rem, pc))
        rank = np.arange(pc.size) - pair_first[pc[by_rem]]
        quota[by_rem[rank < limit[pc[by_rem]]]] += 1
    # the draws: pair p makes m_p − 1 of them, for i = m_p − 1 down to 1; a client's draws are its pairs' in order
    steps = m - 1
    step_first = np.zeros(pc.size + 1, dtype=np.int64)
    np.cumsum(steps, out=step_first[1:])
    client_steps = step_first[pair_first[1:]] - step_first[pair_first[:-1]]
    bound = np.repeat(step_first[:-1] + m - 1, steps) - np.arange(step_first[-1])  # m_p − 1 − (t − first draw)
    # random_interval's mask, 2**bit_length − 1; bounds fit 32 bits (draws of a class of more than 2**32 + 1 members
    # would take 64-bit outputs: such clients, if any, draw with their Generator below)
    mask = ((np.uint64(1) << np.frexp(bound)[1].astype(np.uint64)) - np.uint64(1)).astype(np.uint32)
    bound = bound.astype(np.uint32)
    accepted = np.zeros(bound.size, dtype=np.uint32)
    # a few clients with the most draws go to the per-client generator: the vectorised loops below run about
    # 1.4 × (the most draws of a client) times, at ~50 µs a pass (pass_cost_us per draw of the client with the
    # most); a client on its own costs ~3 µs + 2 µs a class
    by_steps = np.argsort(-client_steps, kind="stable")
    solo_cost = np.cumsum(3.0 + 2.0 * num_classes[by_steps])
    loop_cost = pass_cost_us * client_steps[by_steps]
    loop_cost[np.isin(by_steps, pc[m > 2**32 + 1])] = np.inf  # (see mask)
    total = np.r_[loop_cost[0], solo_cost + np.r_[loop_cost[1:], 0.0]]
    solo = np.sort(by_steps[: int(np.argmin(total))])
    vector = np.ones(drawn.size, dtype=bool)
    vector[solo] = False
    hi, lo, inc_hi, inc_lo = _pcg64_initial(entropy, drawn)
    if solo.size:
        bitgen = np.random.PCG64(0)
        rng = np.random.Generator(bitgen)
        for c, s_hi, s_lo, i_hi, i_lo in zip(solo.tolist(), hi[solo].tolist(), lo[solo].tolist(),
                                              inc_hi[solo].tolist(), inc_lo[solo].tolist()):
            state = {"state": (s_hi << 64) | s_lo, "inc": (i_hi << 64) | i_lo}
            bitgen.state = {"bit_generator": "PCG64", "state": state, "has_uint32": 0, "uinteger": 0}
            for p in range(pair_first[c], pair_first[c + 1]):
                drawn_places = rng.permutation(int(m[p]))[: quota[p]]
                held[pos[starts[p] + drawn_places]] = True
    # draw r of every client still drawing: 32-bit output r (low half of 64-bit output r // 2, then its high half)
    live = np.flatnonzero(vector & (client_steps > 0))
    hi, lo, inc_hi, inc_lo = hi[live], lo[live], inc_hi[live], inc_lo[live]
    at, end = step_first[pair_first[live]], step_first[pair_first[live + 1]]
    out = np.zeros(live.size, dtype=np.uint64)
    r = 0
    while at.size:
        if r % 2 == 0:
            hi, lo = _pcg64_step(hi, lo, inc_hi, inc_lo)
            out = _pcg64_output(hi, lo)
            u = out & _LO32
        else:
            u = out >> _U32
        value = u & mask[at]
        ok = value <= bound[at]
        accepted[at[ok]] = value[ok]
        at = at + ok
        going = at < end
        if not going.all():
            hi, lo, inc_hi, inc_lo, out, at, end = (a[going] for a in (hi, lo, inc_hi, inc_lo, out, at, end))
        r += 1
    # the swaps: place i = m − 1 − s of every pair (of the vectorised clients, quota > 0) with more than s draws
    pairs = np.flatnonzero(vector[pc] & (quota > 0))
    pairs = pairs[np.argsort(-m[pairs], kind="stable")]
    p_start, p_m, p_step = starts[pairs], m[pairs], step_first[pairs]
    places = np.int32 if m.max() < 2**31 else np.int64
    perm = (np.arange(pos.size, dtype=np.int64) - np.repeat(starts, m)).astype(places)  # each pair's arange(m)
    descending = -(p_m - 1)
    for s in range(int(p_m[0]) - 1 if pairs.size else 0):
        live_pairs = int(np.searchsorted(descending, -s, side="left"))  # the pairs with m − 1 > s
        base = p_start[:live_pairs]
        i = base + p_m[:live_pairs] - 1 - s
        j = base + accepted[p_step[:live_pairs] + s].astype(np.int64)
        swap = perm[i]
        perm[i] = perm[j]
        perm[j] = swap
    # held out: the members at each pair's first quota places
    q = quota[pairs]
    take = np.repeat(p_start, q) + (np.arange(int(q.sum())) - np.repeat(np.cumsum(q) - q, q))
    held[pos[np.repeat(p_start, q) + perm[take]]] = True
    return held


def split_client_eval(
    indices: np.ndarray, fraction: float, rng: np.random.Generator, labels: Optional[np.ndarray] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's sample indices into ``(train, eval)``, both int64 and in the order of ``indices``.

    The evaluation part has k = ⌊fraction·n⌋ samples clipped to [1, n − 1] when n ≥ 2 (every such client keeps
    training data and gets evaluation data), k = 0 when n = 1. With ``labels`` (int, indexed by dataset index)
    it is stratified: k is apportioned over the client's classes in proportion to their counts n_c by the
    largest-remainder (Hamilton) method — class c gets ⌊k·n_c/n⌋, and the k − Σ⌊·⌋ left go to the classes with the
    largest fractional parts k·n_c/n − ⌊k·n_c/n⌋ (ties: smaller class index) — and each class's evaluation
    samples are drawn uniformly without replacement by ``rng``. Without labels, k samples are drawn uniformly.

    Example::

        >>> [a.tolist() for a in split_client_eval(np.arange(10, 15), 0.4, np.random.default_rng(0))]
        [[10, 11, 13], [12, 14]]
    """
    indices = np.asarray(indices, dtype=np.int64)
    chosen = _held_out(indices, fraction, rng, labels)
    return indices[~chosen], indices[chosen]


def _held_out(indices: np.ndarray, fraction: float, rng: np.random.Generator, labels: Optional[np.ndarray]) -> np.ndarray:
    """bool ``[n]``: which of one client's ``indices`` :func:`split_client_eval` holds out (the definition that
    :func:`split_partition_eval` reproduces for the whole population)."""
    n = indices.size
    k = 0 if n < 2 else int(np.clip(math.floor(fraction * n + 1e-9), 1, n - 1))
    chosen = np.zeros(n, dtype=bool)
    if k:
        if labels is None:
            chosen[rng.permutation(n)[:k]] = True
        else:
            y = np.asarray(labels)[indices]
            classes, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
            exact = k * counts / n
            quota = np.floor(exact + 1e-9).astype(np.int64)
            left = k - int(quota.sum())
            if left:
                quota[np.argsort(-(exact - quota), kind="stable")[:left]] += 1
            for c in range(classes.size):
                members = np.flatnonzero(inverse == c)
                chosen[members[rng.permutation(members.size)[: quota[c]]]] = True
    return chosen


def split_partition_eval(partition: Partition, fraction: float, entropy: Sequence[int]) -> tuple[Partition, Partition]:
    """Hold out ``fraction`` of every client's share: ``(train, eval)`` partitions over the same dataset.

    Client ``c``'s split is :func:`split_client_eval` of its indices with ``numpy.random.default_rng([*entropy,
    c])``, stratified by ``partition.labels`` when the partition has them — the same split, bit for bit, computed
    without a Python-level generator per client (:func:`pcg64_states`; with labels, the quotas, the PCG64 streams
    and the Fisher-Yates shuffles as array operations over the population, see :func:`_stratified_held`); clients
    of one sample (nothing held out) draw nothing. Both partitions keep each client's samples in partition order;
    ``train`` keeps the partition's labels, classes and names, ``eval`` holds the indices only.

    Args:
        partition: the clients' shares.
        fraction: in (0, 1).
        entropy: the seed prefix, e.g. ``[seed, 0xE5A1]``.

    Example::

        >>> p = Partition.from_client_lists([[0, 1, 2, 3, 4], [5], [6, 7]])
        >>> train, held = split_partition_eval(p, 0.4, [0, 1])
        >>> held.sizes().tolist(), train.sizes().tolist()
        ([2, 0, 1], [3, 1, 1])
        >>> p = Partition.from_client_lists([[0, 1, 2, 3, 4], [5], [6, 7]], labels=[0, 0, 0, 1, 1, 0, 1, 0])
        >>> held = split_partition_eval(p, 0.4, [0, 1])[1]  # client 0: one of each class; 2: a tie, class 0
        >>> [sorted(p.labels[held.client_indices(c)].tolist()) for c in range(3)]
        [[0, 1], [], [0]]
    """
    sizes = partition.sizes()
    offsets = partition.offsets
    flat = partition.indices
    k = np.zeros(sizes.size, dtype=np.int64)
    big = sizes >= 2
    k[big] = np.clip(np.floor(fraction * sizes[big] + 1e-9), 1, sizes[big] - 1).astype(np.int64)
    drawn = np.flatnonzero(k > 0)
    bitgen = np.random.PCG64(0)
    rng = np.random.Generator(bitgen)
    state = {"bit_generator": "PCG64", "state": {"state": 0, "inc": 1}, "has_uint32": 0, "uinteger": 0}
    inner = state["state"]
    held = np.zeros(flat.size, dtype=bool)
    labels = partition.labels
    starts, ns, ks = offsets[drawn].tolist(), sizes[drawn].tolist(), k[drawn].tolist()
    if labels is None:
        perms = []
        append, permutation = perms.append, rng.permutation
        for (s, i), n, kc in zip(pcg64_states(entropy, drawn), ns, ks):
            inner["state"] = s
            inner["inc"] = i
            bitgen.state = state
            append(permutation(n)[:kc])
        if perms:
            held[np.concatenate(perms) + np.repeat(offsets[drawn], k[drawn])] = True
    else:
        held = _stratified_held(partition, k, entropy)
    counts_held = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(k, out=counts_held[1:])
    train = Partition(
        flat[~held], offsets - counts_held, labels=partition.labels, num_classes=partition.num_classes,
        client_names=partition.client_names, label_names=partition.label_names,
    )
    return train, Partition(flat[held], counts_held)


def check_eval_clients_per_round(value: Any) -> Optional[Union[int, str]]:
    """``None``, an int >= 1 or ``"all"``.

    Raises:
        ValueError: naming ``eval_clients_per_round`` and the allowed values.

    Example::

        >>> check_eval_clients_per_round("5"), check_eval_clients_per_round("all")
        (5, 'all')
    """
    if value is None or value == "all":
        return value
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"`eval_clients_per_round` must be None, an integer >= 1 or 'all', got {value!r}.")
    return int(value)


#: ``eval_personal_untrained``'s values: a never-trained client's personal model is the global model (``"global"``)
#: or it is left out of ``fed_personal_<m>`` (``"exclude"``).
PERSONAL_UNTRAINED = ("global", "exclude")


class ClientEvaluation:
    """Federated evaluation's settings: which clients evaluate the global model, on which of their data.

    Args:
        eval_clients_per_round: Clients evaluated at each validation: an int >= 1 (uniformly without replacement,
            seeded by ``(seed, round)``), ``"all"``, or ``None`` (default: off).
        eval_fraction: Hold out this fraction, in (0, 1), of every client's share as its evaluation data
            (:func:`split_partition_eval`); default ``None``: the task's natural per-client split, if any.
        eval_local_steps: Personalised evaluation: fine-tune each evaluation client this many local steps first
            (default 0: off).
        eval_csv: A CSV file receiving one row per (validation, evaluation client) (default ``None``).
        eval_personal_untrained: With a personalised method, an evaluation client without personal state (never
            trained) in ``fed_personal_<m>``: ``"global"`` (default) evaluates it with the global model,
            ``"exclude"`` leaves it out of the personal statistics (:data:`PERSONAL_UNTRAINED`).

    See :class:`~lightning_fed.datamodules.FederatedDataModule` for the whole story.

    Raises:
        ValueError: an ``eval_clients_per_round`` that is not ``None``, an int >= 1 or ``"all"``, an
            ``eval_fraction`` outside (0, 1), a negative ``eval_local_steps``, ``eval_local_steps`` or ``eval_csv``
            without ``eval_clients_per_round``; ``eval_personal_untrained`` not one of :data:`PERSONAL_UNTRAINED`.

    Example::

        >>> ClientEvaluation(eval_clients_per_round=5, eval_fraction=0.2).settings()
        {'eval_clients_per_round': 5, 'eval_fraction': 0.2, 'eval_local_steps': 0, 'eval_csv': None, 'eval_personal_untrained': 'global'}
        >>> ClientEvaluation(eval_fraction=1.5)
        Traceback (most recent call last):
        ...
        ValueError: `eval_fraction` must be None or a number in (0, 1), got 1.5.
    """

    #: This part's settings, the names of :meth:`settings` (each an attribute; the data module forwards them).
    setting_names: ClassVar[tuple[str, ...]] = ("eval_clients_per_round", "eval_fraction", "eval_local_steps",
                                                "eval_csv", "eval_personal_untrained")
    #: Settings that define the training run (none: evaluation does not change training; ``eval_fraction`` changes
    #: the clients' training data, which the checkpoint's partition digest records).
    run_settings: ClassVar[tuple[str, ...]] = ()
    #: Run settings recorded later than the first checkpoints, with their value then (none).
    record_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, eval_clients_per_round: Optional[Union[int, str]] = None, eval_fraction: Optional[float] = None,
                 eval_local_steps: int = 0, eval_csv: Optional[str] = None,
                 eval_personal_untrained: str = "global") -> None:
        self.eval_clients_per_round = check_eval_clients_per_round(eval_clients_per_round)
        if eval_fraction is not None and (
            isinstance(eval_fraction, bool) or not isinstance(eval_fraction, numbers.Real) or not 0 < eval_fraction < 1
        ):
            raise ValueError(f"`eval_fraction` must be None or a number in (0, 1), got {eval_fraction!r}.")
        self.eval_fraction = None if eval_fraction is None else float(eval_fraction)
        self.eval_local_steps = check_int("eval_local_steps", eval_local_steps, 0)
        self.eval_csv = None if eval_csv is None else str(eval_csv)
        self.eval_personal_untrained = check_choice("eval_personal_untrained", eval_personal_untrained,
                                                    PERSONAL_UNTRAINED)
        if self.eval_clients_per_round is None and (self.eval_local_steps or self.eval_csv is not None):
            raise ValueError(
                "`eval_local_steps` and `eval_csv` need federated evaluation: set `eval_clients_per_round` "
                "(an int >= 1 or 'all')."
            )

    def settings(self) -> dict[str, Any]:
        """``{name: value}`` of this part's settings."""
        return {name: getattr(self, name) for name in self.setting_names}

    def held_out(self, partition: Partition, seed: int) -> Optional[tuple[Partition, Partition]]:
        """``(train, eval)`` partitions holding out ``eval_fraction`` of every client's share
        (:func:`split_partition_eval`, seeded by ``[seed, 0xE5A1]``), or ``None`` without ``eval_fraction``."""
        if self.eval_fraction is None:
            return None
        return split_partition_eval(partition, self.eval_fraction, [seed, 0xE5A1])

    def eligible_clients(self, client_eval: Optional[Partition], owner: str) -> Optional[np.ndarray]:
        """The clients with evaluation data (sorted int64; ``None`` when there is no per-client evaluation data),
        checked against ``eval_clients_per_round``; ``owner`` names the data module in the messages.

        Raises:
            ValueError: federated evaluation without per-client evaluation data, no client with any, or more
                evaluation clients than clients with evaluation data.
        """
        eligible = None if client_eval is None else np.flatnonzero(client_eval.sizes() > 0).astype(np.int64)
        if self.eval_clients_per_round is None:
            return eligible
        if eligible is None:
            raise ValueError(
                f"`eval_clients_per_round` is set but {owner} has no per-client evaluation data: "
                "give `eval_fraction` (e.g. 0.2) to hold out part of each client's share."
            )
        if eligible.size == 0:
            raise ValueError("No client has evaluation data: raise `eval_fraction` or use larger clients.")
        if isinstance(self.eval_clients_per_round, int) and self.eval_clients_per_round > eligible.size:
            raise ValueError(
                f"`eval_clients_per_round` ({self.eval_clients_per_round}) must not exceed the number of clients "
                f"with evaluation data ({eligible.size}); use 'all' for all of them."
            )
        return eligible

    def select(self, eligible: np.ndarray, round_idx: int, seed: int) -> np.ndarray:
        """The evaluation clients of round ``round_idx`` among ``eligible`` (sorted int64): all of them
        (``"all"``) or ``eval_clients_per_round`` uniformly without replacement, seeded by ``(seed, round)``.

        Raises:
            RuntimeError: federated evaluation is off.
        """
        if self.eval_clients_per_round is None:
            raise RuntimeError("Federated evaluation is off: set `eval_clients_per_round`.")
        if self.eval_clients_per_round == "all":
            return eligible
        rng = np.random.default_rng([seed, 0xE7A1, int(round_idx)])
        return np.sort(rng.choice(eligible, size=self.eval_clients_per_round, replace=False)).astype(np.int64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.settings().items())})"
