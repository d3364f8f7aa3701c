"""A cohort-batched LSTM for :class:`~lightning_fed.client.vectorized.VectorizedExecutor`.

``vmap`` has no batching rule for oneDNN's/cuDNN's fused LSTM kernels, so a vmapped ``torch.nn.LSTM`` runs
PyTorch's composite LSTM: ~10 small batched operations per time step and layer, each saved for autograd. This
module replaces it, while the vectorized step runs, by :class:`CohortLSTMLayer`: one ``torch.autograd.Function``
per LSTM layer whose ``vmap`` rule folds the client dimension C into an explicit group dimension G, so that the
layer is computed on plain ``[G, ...]`` tensors, outside functorch's per-operation batching:

* float32/bfloat16 on CPU (oneDNN enabled): oneDNN's fused LSTM layer (``aten::mkldnn_rnn_layer`` and its
  ``_backward``, the kernels ``nn.LSTM`` itself runs on CPU) once per client — the same numbers as each client's
  own ``nn.LSTM``, the same speed and workspace memory as sequential training;
* otherwise (float64, CUDA, oneDNN disabled): a batched-matmul LSTM: the input projection of all time steps in one
  ``torch.baddbmm`` (``[G, T·B, in] @ [G, in, 4H]``), then per time step one ``baddbmm`` (``h_{t-1} W_hhᵀ``) and
  the gate non-linearities; the backward pass (back-propagation through time) is written out by hand with the same
  batched products (weight gradients summed over all time steps in one ``bmm`` each).

The function is the LSTM of ``torch.nn.LSTM`` (gate order i, f, g, o; Hochreiter & Schmidhuber 1997 with the
forget gate of Gers et al. 2000, as documented for ``torch.nn.LSTM``)::

    a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh,   i, f, o = σ(a_i, a_f, a_o),   g = tanh(a_g)
    c_t = f ⊙ c_{t-1} + i ⊙ g,   h_t = o ⊙ tanh(c_t)

and its gradients; the batched-matmul version differs from PyTorch's kernels only by rounding (b_ih + b_hh is
added once).

Supported ``nn.LSTM`` configurations (others keep PyTorch's composite implementation, exact but slower):
any ``input_size``/``hidden_size``/``num_layers``, ``bias`` True or False, ``batch_first`` True or False,
``dropout`` 0 (or the module in eval mode, or ``num_layers == 1``), ``bidirectional=False``, ``proj_size=0``; a
batched ``[B, T, in]``/``[T, B, in]`` tensor input (not a ``PackedSequence``, not an unbatched ``[T, in]``
input), with or without an initial state ``(h_0, c_0)``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
from torch import Tensor, nn

__all__ = ["CohortLSTMLayer", "supports", "cohort_lstm"]


def _front(size: int, pairs) -> list[Tensor]:
    """Move each tensor's vmap dimension to the front (expanding unbatched ones to ``size``)."""
    return [t.movedim(d, 0) if d is not None else t.expand(size, *t.shape) for t, d in pairs]


_MKLDNN_LSTM = 2  # ideep::rnn_kind::LSTM, the `mode` of aten::mkldnn_rnn_layer


def _use_onednn(x: Tensor) -> bool:
    """oneDNN's fused LSTM layer (``aten::mkldnn_rnn_layer``, what ``nn.LSTM`` runs on CPU) for float32/bfloat16 on
    CPU while oneDNN is enabled; the batched-matmul implementation otherwise (float64, CUDA, oneDNN disabled)."""
    return (
        x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and torch._C._get_mkldnn_enabled()
        and hasattr(torch.ops.aten, "mkldnn_rnn_layer")
    )


def _lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """Plain-tensor forward. x [G, T, B, in], h0/c0 [G, B, H], w_ih [G, 4H, in], w_hh [G, 4H, H], b_* [G, 4H].

    Returns out [G, T, B, H], h_T, c_T [G, B, H] and two tensors saved for the backward pass: oneDNN's workspaces
    (stacked per group) and an empty tensor, or the activated gates [G, T, B, 4H] (i, f, g, o) and c [G, T, B, H].
    """
    if _use_onednn(x):
        # one fused oneDNN call per group member: the same kernel (and numbers) as nn.LSTM on that member alone
        h_size = w_hh.shape[-1]
        with torch.enable_grad():  # oneDNN keeps the training workspace only in grad mode (no graph: plain inputs)
            parts = [
                torch.ops.aten.mkldnn_rnn_layer(
                    x[g].contiguous(), w_ih[g], w_hh[g], b_ih[g], b_hh[g], h0[g].unsqueeze(0).contiguous(),
                    c0[g].unsqueeze(0).contiguous(), False, [], _MKLDNN_LSTM, h_size, 1, True, False, False, True,
                )
                for g in range(x.shape[0])
            ]
        out, h_t, c_t = (torch.stack(t) for t in list(zip(*parts))[:3])
        # the (large) workspaces stay one tensor per group member: stacking them would copy them
        return (out, h_t.squeeze(1), c_t.squeeze(1), *(p[3] for p in parts))
    bias = b_ih + b_hh
    g_, t_, b_, n_in = x.shape
    h_size = w_hh.shape[-1]
    xw = torch.baddbmm(bias.unsqueeze(1), x.reshape(g_, t_ * b_, n_in), w_ih.transpose(1, 2))
    gates = xw.view(g_, t_, b_, 4 * h_size)  # pre-activations of the input part; overwritten by the activations
    out = x.new_empty(g_, t_, b_, h_size)
    cells = x.new_empty(g_, t_, b_, h_size)
    w_hh_t = w_hh.transpose(1, 2)
    h, c = h0, c0
    for t in range(t_):
        a = torch.baddbmm(gates[:, t], h, w_hh_t)
        act = torch.sigmoid(a)
        act[..., 2 * h_size : 3 * h_size] = torch.tanh(a[..., 2 * h_size : 3 * h_size])
        i, f, g, o = act.chunk(4, dim=-1)
        c = torch.addcmul(f * c, i, g)
        h = o * torch.tanh(c)
        gates[:, t] = act
        cells[:, t] = c
        out[:, t] = h
    return out, h, c, gates, cells


def _lstm_backward(grad_out, grad_hn, grad_cn, x, h0, c0, w_ih, w_hh, b_ih, b_hh, out, h_t, c_t, *saved):
    """Back-propagation through time for :func:`_lstm_forward` (plain tensors, same shapes); returns the gradients
    of x, h0, c0, w_ih, w_hh, b_ih, b_hh."""
    if _use_onednn(x):
        h_size = w_hh.shape[-1]
        parts = [
            torch.ops.aten.mkldnn_rnn_layer_backward(
                x[g].contiguous(), w_ih[g], w_hh[g], b_ih[g], b_hh[g], h0[g].unsqueeze(0).contiguous(),
                c0[g].unsqueeze(0).contiguous(), out[g], h_t[g].unsqueeze(0), c_t[g].unsqueeze(0),
                grad_out[g].contiguous(), grad_hn[g].unsqueeze(0).contiguous(), grad_cn[g].unsqueeze(0).contiguous(),
                False, _MKLDNN_LSTM, h_size, 1, True, True, False, [], False, saved[g],
            )
            for g in range(x.shape[0])
        ]
        d_x, d_w_ih, d_w_hh, d_b_ih, d_b_hh, d_h0, d_c0 = (torch.stack(t) for t in zip(*parts))
        return d_x, d_h0.squeeze(1), d_c0.squeeze(1), d_w_ih, d_w_hh, d_b_ih, d_b_hh
    gates, cells = saved
    g_, t_, b_, n_in = x.shape
    h_size = w_hh.shape[-1]
    d_a = torch.empty_like(gates)
    dh = grad_hn.clone()
    dc = grad_cn.clone()
    for t in range(t_ - 1, -1, -1):
        act = gates[:, t]
        i, f, g, o = act.chunk(4, dim=-1)
        c = cells[:, t]
        c_prev = cells[:, t - 1] if t > 0 else c0
        dh = dh + grad_out[:, t]
        tc = torch.tanh(c)
        # dc += dh * o * (1 - tanh(c)^2)
        dc = dc + dh * o * (1 - tc * tc)
        da = d_a[:, t]
        da_i, da_f, da_g, da_o = da.chunk(4, dim=-1)
        torch.mul(dc * g, i * (1 - i), out=da_i)
        torch.mul(dc * c_prev, f * (1 - f), out=da_f)
        torch.mul(dc * i, 1 - g * g, out=da_g)
        torch.mul(dh * tc, o * (1 - o), out=da_o)
        dc = dc * f
        dh = torch.bmm(da, w_hh)
    d_flat = d_a.view(g_, t_ * b_, 4 * h_size)
    h_prev = torch.cat([h0.unsqueeze(1), out[:, :-1]], dim=1).reshape(g_, t_ * b_, h_size)
    d_w_hh = torch.bmm(d_flat.transpose(1, 2), h_prev)
    d_w_ih = torch.bmm(d_flat.transpose(1, 2), x.reshape(g_, t_ * b_, n_in))
    d_bias = d_flat.sum(dim=1)
    d_x = torch.bmm(d_flat, w_ih).view(g_, t_, b_, n_in)
    return d_x, dh, dc, d_w_ih, d_w_hh, d_bias, d_bias.clone()


#: Arguments of :func:`_lstm_backward` before the saved tensors.
_N_BACKWARD_ARGS = 13


class _CohortLSTMLayerBackward(torch.autograd.Function):
    """The backward pass as a function with its own ``vmap`` rule (no double backward)."""

    @staticmethod
    def forward(*args):
        return _lstm_backward(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("the cohort LSTM does not support double backward")

    @staticmethod
    def vmap(info, in_dims, *args):
        size = info.batch_size
        n = _N_BACKWARD_ARGS
        flat = [t.flatten(0, 1) for t in _front(size, zip(args[:n], in_dims[:n]))]
        # the saved tensors: per-member oneDNN workspaces (unbatched, already in flattened order) or batched
        saved = [t if d is None else t.movedim(d, 0).flatten(0, 1) for t, d in zip(args[n:], in_dims[n:])]
        results = _CohortLSTMLayerBackward.apply(*flat, *saved)
        return tuple(r.unflatten(0, (size, -1)) for r in results), (0,) * len(results)


class CohortLSTMLayer(torch.autograd.Function):
    """One unidirectional LSTM layer on a group of independent problems (one per client).

    ``apply(x [G, T, B, in], h0 [G, B, H], c0 [G, B, H], w_ih [G, 4H, in], w_hh [G, 4H, H], b_ih [G, 4H],
    b_hh [G, 4H])`` -> ``(out [G, T, B, H], h_T [G, B, H], c_T [G, B, H], *saved)``; ``saved`` are kept for the
    backward pass, not differentiable: one oneDNN workspace per group member, or the gates and cell states.
    Under ``torch.func.vmap`` the vmapped dimension is folded into G.

    Example: two clients' layers at once equal ``torch.nn.LSTM`` run per client (time-major, one layer)::

        >>> import torch
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> G, T, B, n_in, H = 2, 5, 3, 4, 6
        >>> lstms = [torch.nn.LSTM(n_in, H).double() for _ in range(G)]
        >>> x = torch.randn(G, T, B, n_in, dtype=torch.float64)
        >>> h0 = c0 = torch.zeros(G, B, H, dtype=torch.float64)
        >>> weights = [torch.stack([getattr(m, name) for m in lstms]).detach()
        ...            for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")]
        >>> out, h_t, c_t, *_ = CohortLSTMLayer.apply(x, h0, c0, *weights)
        >>> out.shape
        torch.Size([2, 5, 3, 6])
        >>> all(torch.allclose(out[g], lstms[g](x[g])[0], atol=1e-12) for g in range(G))
        True
    """

    @staticmethod
    def forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        return _lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh)

    @staticmethod
    def setup_context(ctx, inputs, output):
        out, h_t, c_t, *saved = output
        ctx.save_for_backward(*inputs, out, h_t, c_t, *saved)
        ctx.mark_non_differentiable(*saved)
        ctx.set_materialize_grads(False)  # no zero gradients for the (large) saved tensors

    @staticmethod
    def backward(ctx, grad_out, grad_hn, grad_cn, *_grad_saved):
        x, h0, c0, w_ih, w_hh, b_ih, b_hh, out, h_t, c_t, *saved = ctx.saved_tensors
        grad_out = torch.zeros_like(out) if grad_out is None else grad_out
        grad_hn = torch.zeros_like(h_t) if grad_hn is None else grad_hn
        grad_cn = torch.zeros_like(c_t) if grad_cn is None else grad_cn
        return _CohortLSTMLayerBackward.apply(
            grad_out, grad_hn, grad_cn, x, h0, c0, w_ih, w_hh, b_ih, b_hh, out, h_t, c_t, *saved
        )

    @staticmethod
    def vmap(info, in_dims, *args):
        size = info.batch_size
        flat = [t.flatten(0, 1) for t in _front(size, zip(args, in_dims))]
        out, h_t, c_t, *saved = CohortLSTMLayer.apply(*flat)
        main = tuple(r.unflatten(0, (size, -1)) for r in (out, h_t, c_t))
        if _use_onednn(flat[0]):  # one workspace per (client, member), unbatched, in flattened order
            return (*main, *saved), (0, 0, 0) + (None,) * len(saved)
        return (*main, *(r.unflatten(0, (size, -1)) for r in saved)), (0,) * (3 + len(saved))


def supports(lstm: nn.Module, input: Any, hx: Any = None) -> bool:
    """Whether :func:`cohort_lstm_forward` computes ``lstm(input, hx)`` (see the module doc for the list)."""
    return (
        type(lstm) is nn.LSTM
        and not lstm.bidirectional
        and lstm.proj_size == 0
        and not (lstm.dropout > 0 and lstm.training and lstm.num_layers > 1)
        and isinstance(input, Tensor)
        and input.dim() == 3
        and (hx is None or (isinstance(hx, tuple) and len(hx) == 2 and all(isinstance(h, Tensor) for h in hx)
                            and hx[0].dim() == 3))
    )


def cohort_lstm_forward(lstm: nn.LSTM, input: Tensor, hx: Optional[tuple[Tensor, Tensor]] = None):
    """``lstm(input, hx)`` computed layer by layer with :class:`CohortLSTMLayer` (same outputs and shapes)."""
    x = input.transpose(0, 1) if lstm.batch_first else input  # [T, B, in]
    batch = x.shape[1]
    h_size = lstm.hidden_size
    if hx is None:
        zeros = x.new_zeros(lstm.num_layers, batch, h_size)
        hx = (zeros, zeros)
    layer_in = x.unsqueeze(0)
    h_n, c_n = [], []
    for layer in range(lstm.num_layers):
        w_ih = getattr(lstm, f"weight_ih_l{layer}")
        w_hh = getattr(lstm, f"weight_hh_l{layer}")
        if lstm.bias:
            b_ih, b_hh = getattr(lstm, f"bias_ih_l{layer}"), getattr(lstm, f"bias_hh_l{layer}")
        else:
            b_ih = b_hh = x.new_zeros(4 * h_size)
        out, h_t, c_t, *_ = CohortLSTMLayer.apply(
            layer_in, hx[0][layer].unsqueeze(0), hx[1][layer].unsqueeze(0),
            w_ih.unsqueeze(0), w_hh.unsqueeze(0), b_ih.unsqueeze(0), b_hh.unsqueeze(0),
        )
        layer_in = out
        h_n.append(h_t[0])
        c_n.append(c_t[0])
    output = layer_in[0]
    if lstm.batch_first:
        output = output.transpose(0, 1)
    return output, (torch.stack(h_n), torch.stack(c_n))


@contextlib.contextmanager
def cohort_lstm(module: nn.Module) -> Iterator[None]:
    """While active, every ``torch.nn.LSTM`` in ``module`` runs :func:`cohort_lstm_forward` for the supported
    configurations (``forward`` set as an instance attribute, removed afterwards) and its own forward otherwise."""
    patched = []
    for sub in module.modules():
        if type(sub) is nn.LSTM and "forward" not in sub.__dict__:
            original = sub.forward

            def forward(input, hx=None, _lstm=sub, _original=original):
                if supports(_lstm, input, hx):
                    return cohort_lstm_forward(_lstm, input, hx)
                return _original(input, hx)

            sub.__dict__["forward"] = forward
            patched.append(sub)
    try:
        yield
    finally:
        for sub in patched:
            del sub.__dict__["forward"]


def uses_fused_rnn(module: nn.Module) -> bool:
    """Whether ``module`` has recurrent layers that :func:`cohort_lstm` may not take over (GRU, RNN, subclasses,
    LSTMs in an unsupported configuration): they need PyTorch's composite implementation under ``vmap``."""
    for m in module.modules():
        if isinstance(m, nn.RNNBase) and not (
            type(m) is nn.LSTM and not m.bidirectional and m.proj_size == 0
            and not (m.dropout > 0 and m.training and m.num_layers > 1)
        ):
            return True
    return False
