"""The draws of stochastic compressors: a function of (seed, round, client id) only, so a run, a resumed run and a
run whose clients train in another order draw alike; bytes are whole bytes of the bits counted."""

import numpy as np
import torch

from lightning_fed.communication import bits_to_bytes, client_generator


def test_56_draws_depend_on_seed_round_and_client_only():
    a = torch.rand(5, generator=client_generator(1, 2, 3))
    torch.manual_seed(123)  # the global generator plays no part
    assert torch.equal(a, torch.rand(5, generator=client_generator(1, 2, 3)))
    others = [client_generator(*key) for key in ((0, 2, 3), (1, 1, 3), (1, 2, 4), (1, 3, 2))]
    assert all(not torch.equal(a, torch.rand(5, generator=g)) for g in others)
    state = np.random.SeedSequence([1, 2, 3]).generate_state(1, np.uint64)[0]  # as documented
    assert torch.equal(a, torch.rand(5, generator=torch.Generator().manual_seed(int(state) & (2 ** 63 - 1))))


def test_56_bits_are_rounded_up_to_whole_bytes():
    assert [bits_to_bytes(b) for b in (0, 1, 7, 8, 9, 82)] == [0, 1, 1, 1, 2, 11]
