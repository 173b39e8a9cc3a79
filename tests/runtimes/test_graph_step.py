"""The train step from the exported graph (:mod:`tasks.prepare.runtimes.autograd.graph_step`): the
TorchScript export differentiated as ONNX gives PyTorch's loss and gradients, for generated
convolution, pooling and normalisation layers and for the layer classes of the corpora, without
falling back to the traced step; a graph with an operator it has no rule for is Unsupported."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tasks.prepare.runtimes.autograd import onnx_grad_conv
from tasks.prepare.runtimes.autograd.graph_step import graph_step
from tasks.prepare.runtimes.autograd.onnx_grad import Unsupported
from tasks.prepare.runtimes.autograd.trace import StepInputs

nn = torch.nn


def _ce(outs, labels):
    return nn.functional.cross_entropy(outs[0], labels[0]), (outs[0],)


def _written(tmp_path, model, x, classes, batchnorm="frozen"):
    """The train step of ``model`` on ``x`` written by graph_step; (file, trainable names, labels)."""
    torch.manual_seed(0)
    y = torch.randint(0, classes, (len(x),))
    params = dict(model.named_parameters())
    step = StepInputs([("input", x), ("labels", y)], 1, {n: p.detach() for n, p in params.items()}, {}, _ce)
    grads = [f"{n}_grad" for n in params]
    path = tmp_path / "train_step.onnx"
    noise, _ = graph_step(model, step, ["loss", "logits"], grads, path, training=True, batchnorm=batchnorm)
    return path, list(params), y, noise


def _assert_pytorch_s(path, model, x, y, names):
    """The written step, run in ONNX Runtime, gives PyTorch's loss and gradients (no dropout)."""
    session = onnxruntime.InferenceSession(str(path))
    params = dict(model.named_parameters())
    feeds = {"input": x.numpy(), "labels": y.numpy(), **{n: params[n].detach().numpy() for n in names}}
    got = session.run(None, feeds)
    model.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert abs(got[0] - loss.item()) <= 1e-5 * max(1.0, abs(loss.item()))
    for name, grad in zip(names, got[2:], strict=True):
        want = params[name].grad.numpy()
        assert np.abs(grad - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dims=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 2]),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 2),
    padding=st.integers(0, 2),
    size=st.integers(5, 9),
    bias=st.booleans(),
    pool=st.sampled_from(["max", "avg", "global", "none"]),
    norm=st.sampled_from(["frozen", "batch-stats", "group", "none"]),
    patches=st.sampled_from([onnx_grad_conv.PATCHES_BYTES, 0]),
    transposed=st.sampled_from([False, False, True, "output_padding"]),
)
@example(dims=2, groups=1, kernel=2, stride=2, dilation=1, padding=0, size=5, bias=False, pool="none", norm="none",
         patches=0, transposed=True)  # shrunk: a transposed convolution's weight gradient by the convolution form  # fmt: skip
def test_generated_convolutions_give_pytorch_s_gradients(monkeypatch, tmp_path, dims, groups, kernel, stride,
                                                         dilation, padding, size, bias, pool, norm, patches,
                                                         transposed):  # fmt: skip
    """(``patches`` 0: every weight gradient but a 1x1's by the convolution form, as a large layer's;
    ``transposed``: a ConvTranspose, as a decoder's, with the largest output padding it takes.)"""
    monkeypatch.setattr(onnx_grad_conv, "PATCHES_BYTES", patches)
    if transposed:
        extra = max(stride, dilation) - 1 if transposed == "output_padding" else 0
        conv = (nn.ConvTranspose1d, nn.ConvTranspose2d)[dims - 1](4, 6, kernel, stride, padding, extra, groups, bias,
                                                                  dilation)  # fmt: skip
    else:
        conv = (nn.Conv1d, nn.Conv2d)[dims - 1](4, 6, kernel, stride, padding, dilation, groups, bias)
    torch.manual_seed(1)
    x = torch.randn(5, 4, *([size] * dims))
    with torch.no_grad():
        shape = conv(x).shape
    if min(shape[2:]) < 2:
        return
    layers = [conv]
    if norm == "group":
        layers.append(nn.GroupNorm(2, 6))
    elif norm != "none":
        layers.append((nn.BatchNorm1d, nn.BatchNorm2d)[dims - 1](6))
    layers.append(nn.ReLU())
    pools = {"max": (nn.MaxPool1d, nn.MaxPool2d)[dims - 1](2), "avg": (nn.AvgPool1d, nn.AvgPool2d)[dims - 1](2),
             "global": (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)[dims - 1](1)}  # fmt: skip
    if pool in pools:
        layers.append(pools[pool])
    model = nn.Sequential(*layers, nn.Flatten(), nn.LazyLinear(3))
    model(x)  # the lazy head takes its size
    batchnorm = "frozen" if norm in ("none", "group") else norm
    path, names, y, _ = _written(tmp_path, model, x, 3, batchnorm)
    model.train()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and batchnorm == "frozen":
            m.eval()
    _assert_pytorch_s(path, model, x, y, names)


@pytest.mark.parametrize("groups", [1, 2])
def test_a_head_s_1x1_convolution_folds_the_samples_into_its_weight_gradient(tmp_path, groups):
    """A 1x1 convolution over a pooled map (one position, more output channels: a classifier's head,
    as timm's lcnetv2 ends): its weight gradient is one product over the samples, not one per sample
    summed (those held the batch times the weight: the agent's peak 1.11x ORT's)."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 16, 1, groups=groups), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16, 3)).train()  # fmt: skip
    x = torch.randn(6, 3, 7, 7)
    path, names, y, _ = _written(tmp_path, model, x, 3)
    _assert_pytorch_s(path, model, x, y, names)
    nodes = onnx.load(str(path)).graph.node
    products = {n.output[0] for n in nodes if n.op_type == "MatMul"}
    summed = [n for n in nodes if n.op_type == "ReduceSum" and n.input[0] in products]
    assert len(summed) == 1  # the first convolution's per-sample products only


def test_the_check_runs_pytorch_s_step_on_one_thread(tmp_path):
    """PyTorch's eager step for the check runs on one thread, then the host's setting is back (a pool
    spinning for a core another process held made the check 70x slower)."""
    seen = []

    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 3), nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            seen.append(torch.get_num_threads())
            return self.head(torch.relu(self.conv(x)).flatten(1))

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _written(tmp_path, Counted().train(), torch.randn(5, 3, 6, 6), 3)
        assert seen[0] == 2 and seen[-1] == 1  # the export traces it as it stands; the check on one
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


class _Encoder(nn.Module):
    """Token embedding, a transformer encoder layer (attention, LayerNorm, GELU), mean pooling."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens):
        return self.head(self.layer(self.embed(tokens)).mean(dim=1))


def test_an_encoder_of_tokens_gives_pytorch_s_gradients(tmp_path):
    model = _Encoder().train()
    x = torch.randint(0, 20, (7, 9))
    path, names, y, _ = _written(tmp_path, model, x, 4)
    _assert_pytorch_s(path, model, x, y, names)


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_an_embedding_bag_gives_pytorch_s_gradients(tmp_path, mode):
    model = nn.Sequential(nn.EmbeddingBag(20, 8, mode=mode), nn.Linear(8, 3)).train()  # exported as a Loop
    x = torch.randint(0, 20, (7, 6))
    path, names, y, _ = _written(tmp_path, model, x, 3)
    _assert_pytorch_s(path, model, x, y, names)


def test_a_dropout_draws_its_mask_from_a_noise_input(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    x = torch.randn(11, 8)
    path, names, y, noise = _written(tmp_path, model, x, 3)
    assert [(n.name, n.shape) for n in noise] == [("noise.0", ("batch", 16))]
    u = np.random.default_rng(2).random((11, 16), dtype=np.float32)
    params = dict(model.named_parameters())
    feeds = {
        "input": x.numpy(),
        "labels": y.numpy(),
        "noise.0": u,
        **{n: params[n].detach().numpy() for n in names},
    }
    got = onnxruntime.InferenceSession(str(path)).run(None, feeds)
    h = torch.relu(model[0](x)) * torch.from_numpy(u < 0.7).float() / 0.7
    loss = nn.functional.cross_entropy(model[3](h), y)
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    assert abs(got[0] - loss.item()) < 1e-5
    for g, want in zip(got[2:], grads, strict=True):
        np.testing.assert_allclose(g, want.numpy(), rtol=1e-4, atol=1e-5)


def test_an_operator_without_a_rule_is_unsupported(tmp_path):
    class Bent(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.head = nn.Linear(4, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(torch.tan(self.inner(x)))  # ONNX's Tan: no rule here

    with pytest.raises(Unsupported, match="Tan"):
        _written(tmp_path, Bent(), torch.randn(7, 4), 3)
    assert not (tmp_path / "train_step.onnx").exists()


@pytest.mark.parametrize("kernel", [2, (3, 2), 7])
def test_a_max_pool_gives_ties_to_the_first_maximum_as_pytorch(tmp_path, kernel):
    """A convolution with a zero kernel makes every window of the pool a tie: the gradient reaches
    the kernel through the window's first position only, as PyTorch's max pool chooses; windows
    that leave rows or columns out, and one over the whole map (a global pool: the graph's size
    does not grow with its 49 positions)."""
    conv = nn.Conv2d(1, 2, 3, padding=1)
    with torch.no_grad():
        conv.weight.zero_()
    pool = nn.MaxPool2d(kernel)
    features = 2 * pool(torch.zeros(1, 1, 7, 7)).numel()
    model = nn.Sequential(conv, pool, nn.Flatten(), nn.Linear(features, 3)).train()
    x = torch.randn(5, 1, 7, 7)
    path, names, y, _ = _written(tmp_path, model, x, 3)
    _assert_pytorch_s(path, model, x, y, names)
    if kernel == 7:  # (a small window is taken a position at a time: 7 nodes each)
        assert len(onnx.load(str(path)).graph.node) < 80


class _Recurrent(nn.Module):
    def __init__(self, kind, bidirectional, layers, last):
        super().__init__()
        self.rnn = getattr(nn, kind)(3, 8, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head, self.last = nn.Linear(8 * (1 + bidirectional), 4), last

    def forward(self, x):
        y, h = self.rnn(x)
        if self.last:  # the final state, as a classifier over the last hidden state reads it
            return self.head((h[0] if isinstance(h, tuple) else h)[-1])
        return self.head(y.mean(1))


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize(
    ("bidirectional", "layers", "last"), [(False, 2, False), (True, 1, False), (False, 1, True)]
)
def test_recurrent_layers_keep_their_onnx_node_and_give_pytorch_s_gradients(
    tmp_path, kind, bidirectional, layers, last
):
    """The forward stays ONNX's own recurrent node; the backward is one reverse Scan per layer and
    direction, the same size for 12 steps as for 48."""
    import onnx

    sizes = []
    for steps in (12, 48):
        torch.manual_seed(0)
        model = _Recurrent(kind, bidirectional, layers, last).train()
        x = torch.randn(5, steps, 3)
        path, names, y, _ = _written(tmp_path, model, x, 4)
        _assert_pytorch_s(path, model, x, y, names)
        ops = [n.op_type for n in onnx.load(str(path)).graph.node]
        assert ops.count(kind) == layers and ops.count("Scan") >= layers * (1 + bidirectional), ops
        sizes.append(len(ops))
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_a_stacked_recurrent_layer_drops_out_between_its_layers(tmp_path, kind):
    """Its export has no training-mode dropout of its own: run layer by layer, a Dropout between
    them, whose mask (a noise input) PyTorch's own run draws alike."""
    torch.manual_seed(0)
    rnn = getattr(nn, kind)(3, 8, num_layers=2, dropout=0.4, batch_first=True)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = rnn, nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.rnn(x)[0].mean(1))

    path, names, y, noise = _written(tmp_path, Head().train(), torch.randn(6, 10, 3), 4)
    assert [n.shape for n in noise] == [("batch", 10, 8)]  # one mask, on the first layer's output


@pytest.mark.parametrize(("mode", "corners"), [("nearest", None), ("bilinear", False), ("bilinear", True)])
@pytest.mark.parametrize("transposed", [False, True])
def test_upsampling_layers_give_pytorch_s_gradients(tmp_path, mode, corners, transposed):
    """A Resize's gradient (two fixed matrices read from ONNX Runtime's own resize) and a transposed
    convolution's (its adjoint convolution), as a U-Net's decoder has them."""
    up = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1) if transposed else nn.Identity()
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Upsample(scale_factor=2, mode=mode, align_corners=corners),
                          up, nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))  # fmt: skip
    x = torch.randn(5, 1, 5, 6)
    model(x)
    path, names, y, _ = _written(tmp_path, model.train(), x, 3)
    _assert_pytorch_s(path, model, x, y, names)
