"""NumPy seeding from a few small integers, without ``SeedSequence``'s per-element reading of a list (issue #51).

``numpy.random.SeedSequence([a, b, c])`` reads a list element by element (each int split into 32-bit words, the
words concatenated: about 25 µs of Python for four ints), while a ``uint32`` array is taken as the words themselves.
For ints in ``[0, 2**32)`` the two are the same entropy — one word per int, the int itself — so the same pool, the
same ``generate_state`` and, through ``PCG64``, the same generator, bit for bit. A client's torch seed
(:func:`~lightning_fed.client.sequential.client_seed`) and its batch order
(:func:`~lightning_fed.datamodules.local_work.batch_schedule`) are seeded this way once per client and round.
"""

from __future__ import annotations

from typing import Union

import numpy as np

_UINT32_MAX = 0xFFFFFFFF


def seed_entropy(*values: int) -> Union[np.ndarray, list]:
    """``values`` as the entropy of ``numpy.random.SeedSequence(list(values))``: a ``uint32`` array of them when each
    is a Python ``int`` in ``[0, 2**32)`` (one 32-bit word each, as NumPy reads such an int), else the list itself
    (larger ints, NumPy integers, anything else: read by NumPy as before, errors included).

    Example::

        >>> seed_entropy(0, 7, 2**32 - 1)
        array([         0,          7, 4294967295], dtype=uint32)
        >>> seed_entropy(0, 2**32)  # two words for 2**32: the list, as NumPy reads it
        [0, 4294967296]
        >>> bool((np.random.SeedSequence(seed_entropy(3, 5)).pool == np.random.SeedSequence([3, 5]).pool).all())
        True
    """
    for value in values:
        if type(value) is not int or not 0 <= value <= _UINT32_MAX:
            return list(values)
    return np.array(values, dtype=np.uint32)


def seed_sequence(*values: int) -> np.random.SeedSequence:
    """``numpy.random.SeedSequence(list(values))``, read through :func:`seed_entropy` (the same pool and states)."""
    return np.random.SeedSequence(seed_entropy(*values))


def default_rng(*values: int) -> np.random.Generator:
    """``numpy.random.default_rng(list(values))`` — which is ``Generator(PCG64(SeedSequence(list(values))))`` — made
    from :func:`seed_sequence`: the same generator state, so the same draws, bit for bit.

    Example::

        >>> default_rng(0, 3, 17).permutation(6).tolist() == np.random.default_rng([0, 3, 17]).permutation(6).tolist()
        True
    """
    return np.random.Generator(np.random.PCG64(seed_sequence(*values)))
