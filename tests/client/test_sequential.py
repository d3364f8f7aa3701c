"""lightning_fed/client/sequential.py: seeding a client (the executor itself is exercised by tests/client/test_runner.py
and every fit in the suite)."""


def test_seed_client_on_cpu_gives_torch_manual_seeds_numbers_without_touching_accelerator_seeds():
    """seed_client(s, cpu) = torch.manual_seed(s) for every CPU random number (rand, randn, randperm, dropout
    masks), and queues no lazy CUDA seed (what cost ~1 ms per client on a CUDA build of torch without a GPU)."""
    import torch

    from lightning_fed.client.sequential import seed_client

    def draws():
        return [torch.rand(5), torch.randn(4, dtype=torch.float64), torch.randperm(9),
                torch.nn.functional.dropout(torch.ones(16), 0.5)]

    torch.manual_seed(123)
    expected = draws()
    seed_client(123, torch.device("cpu"))
    for a, b in zip(draws(), expected):
        assert torch.equal(a, b)
    if not torch.cuda.is_initialized():
        tracker = torch.cuda._lazy_seed_tracker
        before = tracker.get_calls()
        seed_client(5, torch.device("cpu"))
        assert tracker.get_calls() == before
