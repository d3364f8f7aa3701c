"""Does batching the cohort's per-client matrix products pay on this device? (issue #15, the vectorized executor)

One local step of C = 10 clients (B = 20 each) of the ``FedAwareCNN`` ``mlp`` architecture (784-200-200-10, ReLU,
cross-entropy), forward and backward, four ways: ``loop`` — one client after another with ``F.linear``;
``baddbmm`` — stacked per-client weights, batched matrix products, autograd; ``vmap`` — ``torch.func.vmap(grad)``
over the stacked weights (what the vectorized executor runs) plus a ``_foreach_add_`` SGD step; ``one-model`` — one
set of weights on the cohort's 200 samples at once (the same FLOPs in one large product: not federated training,
only the bound that per-client weights rule out). Variants are interleaved, each timed as the median of 7 × 20
steps after 5 warm-up steps; run it twice to see the spread.

Usage::

    .venv/bin/python benchmarks/batched_matmul.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import grad_and_value, vmap

DIMS = (784, 200, 200, 10)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--batch", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c, b = args.clients, args.batch
    weights = [torch.randn(c, o, i) * 0.05 for i, o in zip(DIMS[:-1], DIMS[1:])]
    biases = [torch.zeros(c, o) for o in DIMS[1:]]
    x, y = torch.randn(c, b, DIMS[0]), torch.randint(0, DIMS[-1], (c, b))
    w1 = [w[0].clone().requires_grad_(True) for w in weights]
    b1 = [v[0].clone().requires_grad_(True) for v in biases]

    def mlp(h, ws, bs):
        for k, (w, v) in enumerate(zip(ws, bs)):
            h = F.linear(h, w, v)
            if k < len(ws) - 1:
                h = torch.relu(h)
        return h

    def loop():
        for i in range(c):
            torch.autograd.grad(F.cross_entropy(mlp(x[i], w1, b1), y[i]), w1 + b1)

    def baddbmm():
        ws = [w.detach().requires_grad_(True) for w in weights]
        bs = [v.detach().requires_grad_(True) for v in biases]
        h = x
        for k, (w, v) in enumerate(zip(ws, bs)):
            h = torch.baddbmm(v.unsqueeze(1), h, w.transpose(1, 2))
            if k < len(ws) - 1:
                h = torch.relu(h)
        loss = F.cross_entropy(h.reshape(-1, DIMS[-1]), y.reshape(-1), reduction="sum") / b
        grads = torch.autograd.grad(loss, ws + bs)
        with torch.no_grad():
            torch._foreach_add_(weights + biases, list(grads), alpha=-0.01)

    def vmapped():
        def loss_fn(ws, bs, xx, yy):
            return F.cross_entropy(mlp(xx, ws, bs), yy)

        (gw, gb), _ = vmap(grad_and_value(loss_fn, argnums=(0, 1)))(weights, biases, x, y)
        with torch.no_grad():
            torch._foreach_add_(weights + biases, list(gw) + list(gb), alpha=-0.01)

    xs, ys = x.reshape(-1, DIMS[0]), y.reshape(-1)

    def one_model():
        torch.autograd.grad(F.cross_entropy(mlp(xs, w1, b1), ys), w1 + b1)

    variants = {"loop": loop, "baddbmm": baddbmm, "vmap": vmapped, "one-model": one_model}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, fn in variants.items():
        for _ in range(5):
            fn()
    for _ in range(7):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(20):
                fn()
            times[name].append((time.perf_counter() - start) / 20)
    print(f"{c} clients x B={b}, MLP {DIMS}, threads={torch.get_num_threads()}: ms per cohort step (median of 7)")
    for name, ts in times.items():
        print(f"  {name:>9}: {1e3 * statistics.median(ts):7.3f} ms")


if __name__ == "__main__":
    main()
