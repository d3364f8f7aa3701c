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


def _running_sum(losses):
    """What the executor computed before mean_step_loss: a running ``loss_sum + loss`` of tensors."""
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return float(total) / len(losses)


def test_mean_step_loss_equals_a_running_tensor_sum_bit_for_bit():
    """float32 and float64 losses of very different magnitudes (where the order of additions shows in the last
    bits): the NumPy/Python scalar additions give exactly the running tensor sum, and not a pairwise sum."""
    import math

    import torch

    from lightning_fed.client.sequential import mean_step_loss

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for n in (2, 3, 30, 1000):
            scales = 10.0 ** torch.randint(-7, 7, (n,), generator=g).to(dtype)
            losses = list((torch.rand(n, generator=g, dtype=dtype) * scales).unbind())
            assert mean_step_loss(losses) == _running_sum(losses)
    big = [torch.tensor(1.0)] + [torch.tensor(2.0 ** -24)] * 1000  # each 1 + 2^-24 rounds back to 1 in float32
    assert mean_step_loss(big) == _running_sum(big) == 1.0 / 1001
    assert float(torch.stack(big).sum()) / 1001 != mean_step_loss(big)  # torch's sum rounds differently
    assert math.isnan(mean_step_loss([]))
    assert mean_step_loss([torch.tensor(3.5)]) == 3.5
    w = torch.tensor(2.0, requires_grad=True)  # losses still in a graph are read, not differentiated
    assert mean_step_loss([w * 1, w * 3]) == 4.0


def test_a_handful_of_cpu_losses_added_as_python_floats_equals_the_running_tensor_sum():
    """Issue #44: up to 16 scalar CPU losses are added as Python floats, each float32 sum rounded to float32: the
    running tensor sum bit for bit, also at float32's overflow, with infinities and NaN; float32 subnormals (whose
    handling depends on the CPU's flush-to-zero mode) and other tensors are left to the tensor paths."""
    import math

    import torch

    from lightning_fed.client.sequential import _host_running_sum, mean_step_loss

    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        for n in range(2, 17):
            for _ in range(40):
                scales = 10.0 ** torch.randint(-30, 30, (n,), generator=g).to(dtype)
                signs = torch.randint(0, 2, (n,), generator=g).to(dtype) * 2 - 1
                losses = list((torch.rand(n, generator=g, dtype=dtype) * scales * signs).unbind())
                assert _host_running_sum(losses, dtype) / n == mean_step_loss(losses) == _running_sum(losses)
    big = torch.finfo(torch.float32).max
    inf, nan = float("inf"), float("nan")
    for values in ([big, big], [big, -big, big], [inf, 1.0], [inf, -inf], [nan, 1.0], [3.0, -3.0],
                   [1.0, 2.0 ** -24, 2.0 ** -24, 2.0 ** -24]):
        losses = [torch.tensor(v, dtype=torch.float32) for v in values]
        got, want = mean_step_loss(losses), _running_sum(losses)
        assert got == want or (math.isnan(got) and math.isnan(want)), values
    tiny = [torch.tensor(2.0 ** -130), torch.tensor(1.0)]  # a float32 subnormal
    assert _host_running_sum(tiny, torch.float32) is None and mean_step_loss(tiny) == _running_sum(tiny)
    cancel = [torch.tensor(2.0 ** -125), torch.tensor(-1.5 * 2.0 ** -126)]  # normal values, a subnormal sum
    assert _host_running_sum(cancel, torch.float32) is None and mean_step_loss(cancel) == _running_sum(cancel)
    assert _host_running_sum([torch.tensor(1.0), torch.tensor([2.0])], torch.float32) is None
    assert _host_running_sum([torch.tensor(1.0), torch.tensor(2.0, dtype=torch.float64)], torch.float32) is None


def test_mean_step_loss_falls_back_to_tensor_additions_for_other_losses():
    """Mixed dtypes (float32 then float64 promotes mid-way), bfloat16, shape [1] and mixed shapes: the running tensor
    sum itself."""
    import torch

    from lightning_fed.client.sequential import mean_step_loss

    mixed = [torch.tensor(1.0 + 2.0 ** -20), torch.tensor(1e-9, dtype=torch.float64), torch.tensor(2.0 ** -23)]
    half = [torch.tensor(v, dtype=torch.bfloat16) for v in (1.0, 0.0039, 0.0039, 3.0)]
    shaped = [torch.tensor([0.1]), torch.tensor([0.2]), torch.tensor([0.3])]
    ragged = [torch.tensor(0.1), torch.tensor([0.2])]
    for losses in (mixed, half, shaped, ragged):
        assert mean_step_loss(losses) == _running_sum(losses)
