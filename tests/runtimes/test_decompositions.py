"""The autograd runtime's own backward decompositions equal PyTorch's kernels over generated
configurations (Hypothesis), and a decomposition that differs is caught where a step is built."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasks.errors import ArtifactError
from tasks.prepare.runtimes.autograd import decompositions as dec
from tasks.prepare.runtimes.autograd import fast_grads, op_checks
from tasks.prepare.runtimes.autograd.op_checks import TensorArg, Use, check_recorded, check_use, recording

aten = torch.ops.aten
TOL = 1e-4


def _close(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        if w is None:
            continue
        assert g is not None and g.shape == w.shape
        assert float((g - w).abs().max()) <= TOL * max(1.0, float(w.abs().max()))


@st.composite
def conv_configs(draw):
    nd = draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 2, 3]))
    cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    depthwise = draw(st.booleans())
    if depthwise:  # one input channel per group
        groups, cin = cin, cin
        cout = cin * draw(st.integers(1, 2))
    kernel = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    stride = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    dilation = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    padding = draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd))
    size = draw(st.lists(st.integers(4, 9 if nd < 3 else 6), min_size=nd, max_size=nd))
    transposed = draw(st.booleans())
    out_pad = (
        [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation, strict=True)]
        if transposed
        else [0] * nd
    )
    return nd, groups, cin, cout, kernel, stride, dilation, padding, size, transposed, out_pad


@settings(max_examples=150, deadline=None)
@given(conv_configs(), st.integers(0, 2**16))
@example((2, 1, 2, 3, [3, 3], [2, 2], [1, 1], [1, 1], [7, 8], False, [0, 0]), 0)  # odd size, stride 2
@example((1, 4, 4, 4, [3], [1], [2], [2], [9], False, [0]), 0)  # depthwise, dilated
@example((2, 1, 2, 2, [2, 2], [2, 2], [1, 1], [0, 0], [5, 5], True, [1, 1]), 0)  # transposed, output padding
def test_convolution_backward_equals_pytorch(config, seed):
    nd, groups, cin, cout, kernel, stride, dilation, padding, size, transposed, out_pad = config
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cin, *size, generator=gen)
    w = torch.randn(*((cin, cout // groups) if transposed else (cout, cin // groups)), *kernel, generator=gen)
    try:
        y = aten.convolution(x, w, None, stride, padding, dilation, transposed, out_pad, groups)
    except RuntimeError:  # a configuration PyTorch itself refuses (output smaller than the kernel)
        return
    if y.numel() == 0:
        return
    gy = torch.randn(y.shape, generator=gen)
    mask = [True, True, True]
    bias = [w.shape[1] * groups if transposed else cout]
    want = aten.convolution_backward(
        gy, x, w, bias, stride, padding, dilation, transposed, out_pad, groups, mask
    )
    # the weight gradient from the patches (one-hot grouped convolution), then as a convolution
    for patches in (fast_grads.PATCH_BYTES, 0):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(fast_grads, "PATCH_BYTES", patches)
            got = dec.convolution_backward(
                gy, x, w, bias, stride, padding, dilation, transposed, out_pad, groups, mask
            )
        _close(got, want)


@st.composite
def pool_configs(draw):
    nd = draw(st.sampled_from([2, 3]))
    kernel = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    stride = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    padding = [draw(st.integers(0, k // 2)) for k in kernel]
    size = draw(st.lists(st.integers(3, 9 if nd == 2 else 6), min_size=nd, max_size=nd))
    return (
        nd,
        kernel,
        stride,
        padding,
        size,
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.sampled_from([None, 2, 5])),
    )


@settings(max_examples=150, deadline=None)
@given(pool_configs(), st.integers(0, 2**16))
@example((2, [2, 3], [2, 3], [1, 0], [5, 8], False, False, None), 0)  # the last window reaches the edge
@example((2, [3, 3], [2, 2], [1, 1], [6, 6], True, True, None), 0)  # ceil mode past the padded input
def test_avg_pool_backward_equals_pytorch(config, seed):
    nd, kernel, stride, padding, size, ceil, include_pad, divisor = config
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(seed))
    forward, backward = (
        (aten.avg_pool2d, aten.avg_pool2d_backward)
        if nd == 2
        else (aten.avg_pool3d, aten.avg_pool3d_backward)
    )
    y = forward(x, kernel, stride, padding, ceil, include_pad, divisor)
    gy = torch.randn_like(y)
    want = backward(gy, x, kernel, stride, padding, ceil, include_pad, divisor)
    _close([dec.avg_pool_backward(gy, x, kernel, stride, padding, ceil, include_pad, divisor)], [want])


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["avg", "max"]),
    st.sampled_from([2, 3]),
    st.lists(st.integers(1, 9), min_size=3, max_size=3),
    st.lists(st.integers(1, 5), min_size=3, max_size=3),
)
def test_adaptive_pool_backward_equals_pytorch(kind, nd, size, out):
    x = torch.randn(2, 3, *size[:nd])
    forward = getattr(aten, f"{'_' if kind == 'avg' else ''}adaptive_{kind}_pool{nd}d")
    backward = getattr(aten, f"{'_' if kind == 'avg' else ''}adaptive_{kind}_pool{nd}d_backward")
    y = forward(x, out[:nd])
    if kind == "avg":
        gy = torch.randn_like(y)
        _close([dec.adaptive_avg_pool_backward(gy, x, nd)], [backward(gy, x)])
    else:  # its backward takes the forward's indices
        gy = torch.randn_like(y[0])
        _close([dec.scatter_pool_backward(gy, x, y[1], nd)], [backward(gy, x, y[1])])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(3, 6), min_size=3, max_size=3), st.lists(st.integers(1, 3), min_size=3, max_size=3),
       st.lists(st.integers(1, 2), min_size=3, max_size=3), st.booleans())  # fmt: skip
def test_max_pool3d_backward_equals_pytorch(size, kernel, stride, ceil):
    x = torch.randn(2, 2, *size)
    padding = [k // 2 for k in kernel]
    y, indices = aten.max_pool3d_with_indices(x, kernel, stride, padding, [1, 1, 1], ceil)
    gy = torch.randn_like(y)
    want = aten.max_pool3d_with_indices_backward(gy, x, kernel, stride, padding, [1, 1, 1], ceil, indices)
    _close([dec.scatter_pool_backward(gy, x, indices, 3)], [want])


def _conv_grads(model: torch.nn.Module, x: torch.Tensor) -> list[Use]:
    """The uses a make_fx trace of the model's weight gradient records."""
    from torch.fx.experimental.proxy_tensor import make_fx

    params = dict(model.named_parameters())

    def grad(x, *ps):
        def loss(p):
            return torch.func.functional_call(model, dict(zip(params, p, strict=True)), (x,)).sum()

        return torch.func.grad(loss)(ps)

    with recording() as uses:
        make_fx(grad, decomposition_table=op_checks.recorded_table(), tracing_mode="symbolic")(
            x, *[p.detach() for p in params.values()]
        )
    return uses


def test_uses_are_recorded_with_the_example_s_sizes_and_checked():
    uses = _conv_grads(torch.nn.Conv2d(3, 4, 3, stride=2, padding=1, groups=1), torch.randn(7, 3, 9, 9))
    assert [u.op for u in uses] == [aten.convolution_backward.default]
    inp = uses[0].args[1]
    assert isinstance(inp, TensorArg) and inp.shape == (7, 3, 9, 9)
    checked = check_recorded(uses)
    assert len(checked) == 1 and max(checked.values()) < TOL


def test_a_wrong_decomposition_is_refused_in_one_line(monkeypatch):
    (use,) = _conv_grads(torch.nn.Conv1d(2, 2, 3), torch.randn(7, 2, 8))
    table = dec.own_table()

    def off_by_a_bit(*args):
        gi, gw, gb = table[aten.convolution_backward.default](*args)
        return gi, gw * 1.01, gb

    monkeypatch.setattr(
        op_checks, "own_table", lambda: {**table, aten.convolution_backward.default: off_by_a_bit}
    )
    with pytest.raises(ArtifactError) as info:
        check_use(use)
    assert "aten.convolution_backward" in str(info.value) and "\n" not in str(info.value)


def test_a_max_pool_s_use_is_checked_with_the_indices_of_its_forward():
    from torch.fx.experimental.proxy_tensor import make_fx

    def grad(x):
        return torch.func.grad(lambda t: torch.nn.functional.adaptive_max_pool2d(t, 2).pow(2).sum())(x)

    with recording() as uses:
        make_fx(grad, decomposition_table=op_checks.recorded_table(), tracing_mode="symbolic")(
            torch.randn(7, 3, 5, 5)
        )
    assert [u.op for u in uses] == [aten.adaptive_max_pool2d_backward.default]
    assert max(check_recorded(uses).values()) < TOL


def _traced_uses(fn, *args) -> list[Use]:
    from torch.fx.experimental.proxy_tensor import make_fx

    with recording() as uses:
        make_fx(fn, decomposition_table=op_checks.recorded_table(), tracing_mode="symbolic")(*args)
    return uses


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.sampled_from([0.0, 0.5, -1.0]),
    st.integers(0, 2**16),
)
def test_threshold_backward_equals_pytorch_at_and_around_the_threshold(shape, threshold, seed):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 2).round() / 2  # values at it
    g = torch.randn(shape)
    assert torch.equal(
        fast_grads.threshold_backward(g, x, threshold), aten.threshold_backward(g, x, threshold)
    )


def test_threshold_backward_is_recorded_and_checked():
    uses = _traced_uses(
        lambda x: torch.func.grad(lambda t: t.relu().pow(2).sum())(x), torch.randn(7, 3, 8, 8)
    )
    assert [u.op for u in uses] == [aten.threshold_backward.default]
    assert max(check_recorded(uses).values()) < TOL


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 3),
    st.sampled_from([[2, 2], [3, 3], [2, 3], [2], [1, 1]]),
    st.sampled_from(["tiled", "stride 1", "padded"]),
    st.booleans(),
    st.integers(0, 1),
    st.integers(0, 2**16),
)
@example(2, [2, 2], "tiled", True, 0, 0)  # ReLU's zeros: windows of equal maxima
@example(1, [2, 2], "tiled", False, 1, 0)  # a row and a column past the last window
def test_max_pool2d_equals_pytorch_with_ties_and_no_indices_when_it_tiles(n, kernel, how, relu, extra, seed):
    """Values, indices and the gradient equal PyTorch's kernel's; ties (after a ReLU, or rounded
    values) go to the window's first maximum as PyTorch's kernel routes them."""
    gen = torch.Generator().manual_seed(seed)
    k = kernel * (2 // len(kernel))
    x = torch.randn(n, 2, k[0] * 3 + extra, k[1] * 2 + extra, generator=gen)
    x = x.relu() if relu else (x * 2).round() / 2  # many equal values either way
    stride, padding = {"tiled": ([], [0]), "stride 1": ([1], [0]), "padded": (kernel, [k[0] // 2])}[how]
    want_y, want_i = aten.max_pool2d_with_indices(x, kernel, stride, padding)
    got = fast_grads.max_pool2d_with_indices(x, kernel, stride, padding)
    if (stride or kernel) * (2 // len(stride or kernel)) == k and padding[0] == 0:  # windows tile x
        assert torch.equal(got[0], want_y) and torch.equal(got[1], want_i)
    else:
        assert got is NotImplemented  # PyTorch's operator itself
    gy = torch.randn(want_y.shape, generator=gen)
    want = aten.max_pool2d_with_indices_backward(gy, x, kernel, stride, padding, [1], False, want_i)
    got = fast_grads.max_pool2d_with_indices_backward(gy, x, kernel, stride, padding, [1], False, want_i)
    assert torch.equal(got, want)


def test_the_tiling_pool_is_recorded_and_checked_and_an_overlapping_one_is_pytorch_s():
    def grad(x):
        return torch.func.grad(lambda t: torch.nn.functional.max_pool2d(t.relu(), 2).pow(2).sum())(x)

    uses = _traced_uses(grad, torch.randn(7, 3, 8, 8))
    assert {u.op for u in uses} == {
        aten.threshold_backward.default,
        aten.max_pool2d_with_indices.default,
        aten.max_pool2d_with_indices_backward.default,
    }
    assert max(check_recorded(uses).values()) < TOL
    overlapping = _traced_uses(
        lambda x: torch.func.grad(lambda t: torch.nn.functional.max_pool2d(t, 3, 2).sum())(x),
        torch.randn(2, 3, 9, 9),
    )
    assert [u.op for u in overlapping] == [aten.max_pool2d_with_indices_backward.default]
    assert max(check_recorded(overlapping).values()) < TOL


POOLED = """
import torch
from torch import nn


class Pooled(nn.Module):  # conv -> ReLU -> max pool -> linear
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.max_pool2d(torch.relu(self.conv(x)), 2), 1))


def pooled(num_classes=3):
    return Pooled(num_classes)
"""


@pytest.mark.slow
def test_the_step_graph_has_none_of_onnx_runtime_s_slow_nodes(tmp_path):
    """The train step of conv -> ReLU -> 2x2 max pool -> linear, everything trained: two Convs (the
    forward's and the weight gradient's), no MaxPool giving indices, no per-pixel Where or
    ScatterElements (the cross-entropy's per-sample ones stay), and the preparation's own checks
    pass (the step equals PyTorch's)."""
    import onnx

    from tasks.prepare.pipeline import prepare
    from tests.prepare.kit import tiny_recipe

    changes = {"model": {"callable": "pooledmodels:pooled"}, "trainable": {"strategy": "all"},
               "training": {"runtime": "autograd"}}  # fmt: skip
    recipe = tiny_recipe(tmp_path, changes)
    (tmp_path / "pooledmodels.py").write_text(POOLED)
    done = prepare(recipe, tmp_path / "out")
    assert done.validation["passed"]
    step = onnx.load(str(done.artifacts_dir / "train_step.onnx"))
    ops = [n.op_type for n in step.graph.node]
    assert ops.count("Conv") == 2, ops
    assert all(len(n.output) == 1 for n in step.graph.node if n.op_type == "MaxPool"), (
        "a MaxPool gives indices"
    )
    inferred = onnx.shape_inference.infer_shapes(step).graph.value_info
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in inferred}
    slow = [
        (n.op_type, rank.get(n.output[0]))
        for n in step.graph.node
        if n.op_type in ("Where", "ScatterElements")
    ]
    assert slow and all(r is not None and r <= 2 for _, r in slow), slow  # the loss's: per sample
