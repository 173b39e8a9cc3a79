"""The arithmetic of :mod:`.recurrent`'s operators in PyTorch: a layer's forward by PyTorch's own
kernel (:func:`forward_kernel`), its backward by the formulas :mod:`.recurrent_onnx` writes in ONNX,
step by step (:func:`backward_math`), and the check of the second against PyTorch's autograd of the
first on each configuration a model uses (:func:`check_backward`)."""

from __future__ import annotations

from typing import Any

from tasks.errors import ArtifactError

MODES = {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}  # gates per mode
RTOL = 1e-4  # of the largest |value| of PyTorch's gradient (float32 sums in another order)


def forward_kernel(x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, w_hr: Any,
                   mode: str) -> Any:  # fmt: skip
    """One layer and direction with PyTorch's own kernel: ``x`` [T, B, I], states [B, H] (an LSTM
    with a projection ``w_hr`` [P, H], empty without: ``h0`` [B, P]) -> (the output sequence
    [T, B, H or P], the last cell state [B, H]; ``c0`` itself but for an LSTM)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    weights = [w_ih, w_hh, b_ih, b_hh, *([w_hr] if w_hr.numel() else [])]
    if mode == "LSTM":
        y, _, c = torch._VF.lstm(x, (h0[None], c0[None]), weights, True, 1, 0.0, False, False, False)
        return y.contiguous(), c[0].contiguous()
    kernel = {"GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh, "RNN_RELU": torch._VF.rnn_relu}[mode]
    y, _ = kernel(x, h0[None], weights, True, 1, 0.0, False, False, False)
    return y.contiguous(), c0.clone()


def backward_math(gy: Any, gc: Any, x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any,
                  w_hr: Any, y: Any, mode: str) -> list[Any]:  # fmt: skip
    """The gradients of (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr) given those of the output sequence (``gy``)
    and of the last cell state (``gc``; but for an LSTM that output is ``c0`` itself): the formulas
    :mod:`.recurrent_onnx` writes, step by step."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    hprev = torch.cat([h0[None], y[:-1]], 0)
    pre_x, pre_h = x @ w_ih.T + b_ih, hprev @ w_hh.T + b_hh
    per_step = _gates(mode, pre_x, pre_h, c0, y)
    dh, dc, dgx, dgh, dw_hr = torch.zeros_like(h0), gc, [], [], torch.zeros_like(w_hr)
    for t in range(y.shape[0] - 1, -1, -1):
        d = gy[t] + dh
        if w_hr.numel():  # h = m W_hr^T with m = o tanh(c): through the projection first
            dw_hr = dw_hr + d.T @ (per_step[3][t] * per_step[4][t])
            d = d @ w_hr
        gates_x, gates_h, dh_prev, dc = _step_back(mode, d, dc, [s[t] for s in per_step], hprev[t])
        dh = dh_prev + gates_h @ w_hh
        dgx.append(gates_x)
        dgh.append(gates_h)
    gx, gh = torch.stack(dgx[::-1]), torch.stack(dgh[::-1])
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    grads = [
        gx @ w_ih,
        dh,
        dc,
        flat(gx).T @ flat(x),
        flat(gh).T @ flat(hprev),
        gx.sum((0, 1)),
        gh.sum((0, 1)),
        dw_hr,
    ]
    return [g.contiguous() for g in grads]


def _gates(mode: str, pre_x: Any, pre_h: Any, c0: Any, y: Any) -> list[Any]:
    """What each step's backward reads, for all steps at once (LSTM: the cell states by a scan)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if mode == "GRU":
        xr, xz, xn = pre_x.chunk(3, -1)
        hr, hz, hn = pre_h.chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return [r, z, torch.tanh(xn + r * hn), hn]
    if mode == "LSTM":
        i, f, g, o = (pre_x + pre_h).chunk(4, -1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        cells, c = [], c0
        for t in range(y.shape[0]):
            c = f[t] * c + i[t] * g[t]
            cells.append(c)
        c = torch.stack(cells)
        return [i, f, g, o, torch.tanh(c), torch.cat([c0[None], c[:-1]], 0)]
    slope = (1 - y * y) if mode == "RNN_TANH" else (y > 0).to(y.dtype)
    return [slope]


def _step_back(mode: str, d: Any, dc: Any, s: list[Any], hprev: Any) -> tuple[Any, Any, Any, Any]:  # noqa: C901
    """One step back: (pre-activation gradients of the input and recurrent products, the direct
    part of the previous state's gradient, the previous cell state's gradient)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if mode == "GRU":
        r, z, n, hn = s
        dn = d * (1 - z) * (1 - n * n)
        dz = d * (hprev - n) * z * (1 - z)
        dr = dn * hn * r * (1 - r)
        return torch.cat([dr, dz, dn], -1), torch.cat([dr, dz, dn * r], -1), d * z, dc
    if mode == "LSTM":
        i, f, g, o, tc, cprev = s
        dct = dc + d * o * (1 - tc * tc)
        gates = torch.cat([dct * g * i * (1 - i), dct * cprev * f * (1 - f), dct * i * (1 - g * g),
                           d * tc * o * (1 - o)], -1)  # fmt: skip
        return gates, gates, 0.0, dct * f  # the state reaches the gates through W_hh only
    dp = d * s[0]
    return dp, dp, 0.0, dc


def check_backward(use: Any, seed: int = 0) -> float:
    """Our backward of one recorded layer configuration against PyTorch's autograd of its own
    recurrent kernel, on random data; the largest difference relative to PyTorch's largest value
    (ArtifactError beyond :data:`RTOL`)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    x_arg, h_arg, c_arg, _, p_arg, mode = use.args
    (steps, batch, features), out, gates = x_arg.shape, h_arg.shape[-1], MODES[mode]
    hidden = c_arg.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen) * 0.5  # noqa: E731
    leaves = [rand(steps, batch, features), rand(batch, out), rand(batch, hidden), rand(gates * hidden, features),
              rand(gates * hidden, out), rand(gates * hidden), rand(gates * hidden), rand(*p_arg.shape)]  # fmt: skip
    leaves = [t.requires_grad_() for t in leaves]
    y, c = forward_kernel(*leaves, mode)
    gy, gc = rand(*y.shape), rand(*c.shape)
    want = torch.autograd.grad([y, c], leaves, [gy, gc], allow_unused=True)
    got = backward_math(gy, gc, *[t.detach() for t in leaves], y.detach(), mode)
    worst = 0.0
    for w, g in zip(want, got, strict=True):
        w = torch.zeros_like(g) if w is None else w
        if not g.numel():  # no projection: its empty weight
            continue
        worst = max(worst, float((g - w).abs().max()) / max(1.0, float(w.abs().max())))
    if not worst <= RTOL:
        raise ArtifactError(f"the backward of {use.describe()} differs from PyTorch's autograd by {worst:.3g} "
                            f"(relative; at most {RTOL} expected): this recurrent layer cannot train with "
                            "training.runtime = 'autograd' yet")  # fmt: skip
    return worst
