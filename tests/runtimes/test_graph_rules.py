"""The gradient rules of :mod:`tasks.prepare.runtimes.autograd.onnx_grad_more` and
:mod:`~tasks.prepare.runtimes.autograd.onnx_grad_index` (gathers and scatters), an attention's
dropout drawn from a noise input, and the float64 judgement of a step beyond the float32 bound:
each layer's train step from the exported graph gives PyTorch's loss and gradients (a Hypothesis
test draws the layers and their sizes)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tasks.prepare.runtimes.autograd.graph_step import _judged_in_float64, graph_step
from tasks.prepare.runtimes.autograd.onnx_grad import Unsupported
from tasks.prepare.runtimes.autograd.trace import StepInputs
from tests.runtimes.test_graph_step import _assert_pytorch_s, _ce, _written

nn = torch.nn


class _Apply(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _layer(kind: str, channels: int) -> nn.Module:
    """A layer whose export holds the operator ``kind`` names, keeping [N, channels, H, W]."""
    simple = {"elu": nn.ELU(0.7), "selu": nn.SELU(), "celu": nn.CELU(1.3), "softsign": nn.Softsign(),
              "prelu": nn.PReLU(channels), "atan": _Apply(torch.atan), "sin": _Apply(torch.sin),
              "cos": _Apply(torch.cos), "floor": _Apply(lambda x: x + torch.floor(x)),
              "maximum": _Apply(lambda x: torch.maximum(x, x.flip(1))),
              "minimum": _Apply(lambda x: torch.minimum(x, 0.5 * x)),
              "cumsum": _Apply(lambda x: torch.cumsum(x, 3)),
              "reverse-cumsum": _Apply(lambda x: torch.cumsum(x.flip(3), 3).flip(3))}  # fmt: skip
    if kind in simple:
        return simple[kind]
    if kind == "weight-norm":  # ReduceL2 of the weight (torch.nn.utils.parametrizations.weight_norm)
        return nn.utils.parametrizations.weight_norm(nn.Conv2d(channels, channels, 3, padding=1))
    if kind == "pixel-shuffle":  # DepthToSpace (CRD) after a conv making 4x the channels
        return nn.Sequential(nn.Conv2d(channels, 4 * channels, 1), nn.PixelShuffle(2), nn.AvgPool2d(2))
    if kind == "pixel-unshuffle":  # SpaceToDepth-like reshapes, then back
        return nn.Sequential(
            nn.PixelUnshuffle(2), nn.Conv2d(4 * channels, 4 * channels, 1), nn.PixelShuffle(2)
        )
    return _Apply(lambda x: x.repeat(1, 2, 1, 1)[:, :channels] + x.repeat(1, 1, 1, 2)[..., ::2])  # Tile


KINDS = ["elu", "selu", "celu", "softsign", "prelu", "atan", "sin", "cos", "floor", "maximum", "minimum",
         "cumsum", "reverse-cumsum", "weight-norm", "pixel-shuffle", "pixel-unshuffle", "tile"]  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=3), channels=st.sampled_from([2, 4]),
       size=st.sampled_from([4, 6]), seed=st.integers(0, 3))  # fmt: skip
def test_generated_layers_of_the_added_rules_give_pytorch_s_gradients(tmp_path, kinds, channels, size, seed):
    torch.manual_seed(seed)
    body = [nn.Conv2d(3, channels, 3, padding=1)]
    body += [_layer(k, channels) for k in kinds]
    model = nn.Sequential(*body, nn.Flatten(), nn.Linear(channels * size * size, 3)).train()
    x = torch.randn(5, 3, size, size)
    path, names, y, _ = _written(tmp_path, model, x, 3)  # Unsupported (no rule) would fail here
    _assert_pytorch_s(path, model, x, y, names)


def _rows(x):  # GatherND of [N, C] positions, each an [H, W] row; ScatterND of the rows written back
    y = x.clone()
    y[x.mean((2, 3)) > 0] = x[x.mean((2, 3)) > 0].flip(-1) * 2
    return y


def _elements(x):  # GatherND and ScatterND of single elements
    y = torch.zeros_like(x)
    y[x > 0] = x[x > 0] * 3
    return y + x


def _flat(x):  # the same over a flattened view
    f, y = x.reshape(-1), torch.zeros_like(x.reshape(-1))
    y[f > 0] = torch.sin(f[f > 0])
    return y.reshape(x.shape) + x


def _put(x):  # TopK indices naming samples, ScatterND of the others' values there
    y, order = x.clone(), x[:, 0, 0, 0].argsort()
    y[order[:2]] = x[order[-2:]] * 3
    return y


INDEXING = {"rows": _rows, "elements": _elements, "flat": _flat, "put": _put,
            "gather": lambda x: torch.gather(x, 3, x.argsort(3, descending=True)),
            "scatter": lambda x: x.scatter(3, x.argsort(3), x * 2) + x,
            "scatter-add": lambda x: torch.zeros_like(x).scatter_add(3, (x > 0).long(), x) + x,
            "sort": lambda x: x.sort(3).values, "topk": lambda x: torch.cat([x.topk(2, 3).values, x[..., 2:]], 3),
            "select": lambda x: x.index_select(0, torch.nonzero(x.flatten(1).sum(1) > 0).squeeze(1)).sum(0) + x,
            "negative": lambda x: x[:, :, [-1, 0, -2, 1]],
            "constant": lambda x: x.masked_fill(x < -1, -2.0)}  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(sorted(INDEXING)), min_size=1, max_size=3), seed=st.integers(0, 3))
@example(kinds=["elements"], seed=0)  # a ScatterND's updates sliced to a count the graph computes
def test_generated_gathers_and_scatters_give_pytorch_s_gradients(tmp_path, kinds, seed):
    """Boolean-mask selection and assignment (NonZero, GatherND, ScatterND), ``gather`` and
    ``scatter`` (GatherElements, ScatterElements), ``sort`` and ``topk`` (TopK, its values and its
    indices), ``index_select`` of a mask's positions, negative indices: PyTorch's gradients (a
    wiki-style SSD loss had 'no gradient rule for GatherND' and went to the traced step)."""
    torch.manual_seed(seed)
    layers = [_Apply(INDEXING[k]) for k in kinds]
    model = nn.Sequential(
        nn.Conv2d(3, 2, 3, padding=1), *layers, nn.Flatten(), nn.Linear(2 * 4 * 4, 3)
    ).train()
    x = torch.randn(5, 3, 4, 4)
    path, names, y, _ = _written(tmp_path, model, x, 3)
    _assert_pytorch_s(path, model, x, y, names)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_a_cross_entropy_summed_or_per_label_gives_pytorch_s_gradients(tmp_path, reduction):
    """SoftmaxCrossEntropyLoss reduced by ``sum`` (SSD's classification loss) or ``none`` (a loss
    per sample, weighted after): its rule knew ``mean`` only."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).train()
    x, y = torch.randn(5, 3, 6, 6), torch.tensor([0, 1, 2, 0, 1])

    def loss(outs, labels):
        ce = nn.functional.cross_entropy(outs[0], labels[0], reduction=reduction)
        return (ce if reduction == "sum" else (ce * (labels[0] + 1)).sum()) / 5, (outs[0],)

    params = dict(model.named_parameters())
    step = StepInputs([("input", x), ("labels", y)], 1, {n: p.detach() for n, p in params.items()}, {}, loss)
    path = tmp_path / "train_step.onnx"
    graph_step(model, step, ["loss", "logits"], [f"{n}_grad" for n in params], path, training=True,
               batchnorm="frozen")  # fmt: skip
    feeds = {"input": x.numpy(), "labels": y.numpy(), **{n: p.detach().numpy() for n, p in params.items()}}
    got = onnxruntime.InferenceSession(str(path)).run(None, feeds)
    want = torch.autograd.grad(loss((model(x),), (y,))[0], list(params.values()))
    for g, w in zip(got[2:], want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
def test_an_attention_s_dropout_draws_its_mask_from_a_noise_input(tmp_path, norm_first):
    """``nn.TransformerEncoderLayer`` in training: the attention weights' dropout happens inside
    ``scaled_dot_product_attention`` (not ``dropout``): the step must draw it like the others (it
    differed from PyTorch by 0.05 and fell back to the traced step)."""

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(20, 16)
            self.layer = nn.TransformerEncoderLayer(
                16, 2, 32, dropout=0.2, batch_first=True, norm_first=norm_first
            )
            self.head = nn.Linear(16, 4)

        def forward(self, tokens):
            return self.head(self.layer(self.embed(tokens)).mean(1))

    torch.manual_seed(0)
    path, _, _, noise = _written(tmp_path, Encoder().train(), torch.randint(0, 20, (7, 9)), 4)
    assert len(noise) == 4  # attention weights, the two residual dropouts, the feed-forward's
    assert tuple(noise[0].shape[1:]) == (2, 9, 9)


def test_a_step_beyond_the_float32_bound_is_judged_against_float64(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).train()
    x, y = torch.randn(5, 3, 6, 6), torch.tensor([0, 1, 2, 0, 1])
    params = dict(model.named_parameters())
    step = StepInputs([("input", x), ("labels", y)], 1, {n: p.detach() for n, p in params.items()}, {}, _ce)
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(params.values()))
    want = [loss.detach().numpy(), model(x).detach().numpy(), *(g.numpy() for g in grads)]
    names = ["loss", "logits", *(f"{n}_grad" for n in params)]
    rounding = [w * np.float32(1 + 3e-4) for w in want]  # 3x the float32 bound, 0.3x the float64 one
    _judged_in_float64(model, step, [], True, names, rounding, want, "train_step.onnx")
    wrong = [*want[:2], want[2] * np.float32(1.01), *want[3:]]  # a 1 % wrong weight gradient
    with pytest.raises(Unsupported, match="0.weight_grad.*float64"):
        _judged_in_float64(model, step, [], True, names, wrong, want, "train_step.onnx")


@pytest.mark.parametrize("inplace", [False, True])
def test_stochastic_depth_draws_one_mask_per_sample_from_a_noise_input(tmp_path, inplace):
    """timm's DropPath: ``x.new_empty((n, 1, 1, 1)).bernoulli_(keep)`` (the trace fixed n at the
    example batch, and its random operator sent the model to the traced step)."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 3), nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            keep = y.new_empty((y.shape[0], 1, 1, 1))
            keep = keep.bernoulli_(0.7) if not inplace else keep
            if inplace:
                keep.bernoulli_(0.7)
            return self.head((y + y * keep / 0.7).flatten(1))

    _, _, _, noise = _written(tmp_path, Block().train(), torch.randn(6, 3, 6, 6), 3)
    assert [tuple(n.shape) for n in noise] == [("batch", 1, 1, 1)]


def test_an_if_on_the_shape_of_a_weight_is_folded_into_the_branch_it_takes(tmp_path):
    """The exporter writes ``tile`` of a parameter as If nodes on its rank (timm's sam2_hiera: a
    window position embedding); their conditions do not depend on the batch, so each If is the
    branch it takes (it stopped the graph path: an If has no gradient rule)."""

    class Tiled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.pos, self.head = (
                nn.Conv2d(3, 4, 3),
                nn.Parameter(torch.randn(4, 2, 2)),
                nn.Linear(64, 3),
            )

        def forward(self, x):
            return self.head((self.conv(x) + self.pos.tile((1, 2, 2))).flatten(1))

    model, x = Tiled().train(), torch.randn(5, 3, 6, 6)
    path, names, y, _ = _written(tmp_path, model, x, 3)

    assert "If" not in {n.op_type for n in onnx.load(str(path)).graph.node}
    _assert_pytorch_s(path, model, x, y, names)


def test_a_dropout_over_patches_folded_into_the_batch_draws_k_rows_a_sample(tmp_path):
    """MobileViT folds each image's patches into the batch ([n * 4, tokens, channels]) before its
    transformer's dropouts: the noise input is [batch, 4, ...], reshaped as the tensor (the mask had
    the batch's rows: 'broadcast 7 by 28', and the model went to the traced step, 10x slower)."""

    class Folded(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.drop, self.head = (
                nn.Conv2d(3, 8, 3, padding=1),
                nn.Dropout(0.3),
                nn.Linear(8 * 36, 3),
            )

        def forward(self, x):
            y = self.conv(x)  # [n, 8, 6, 6] -> [n * 4, 9, 8]: 2x2 patches of 3x3 pixels as rows
            n = y.shape[0]
            patches = y.reshape(n, 8, 2, 3, 2, 3).permute(0, 2, 4, 3, 5, 1).reshape(n * 4, 9, 8)
            return self.head(self.drop(patches).reshape(n, -1))

    _, _, _, noise = _written(tmp_path, Folded().train(), torch.randn(5, 3, 6, 6), 3)
    assert [tuple(n.shape) for n in noise] == [("batch", 4, 9, 8)]


def test_a_dropout_over_a_tensor_without_the_batch_draws_one_mask_for_all_samples(tmp_path):
    """A dropout on a weight-derived tensor (a relative-position bias, as timm's relpos ViTs and
    Swin V2 CR apply): one mask of its shape (it was refused and the model traced, 5-11x slower)."""

    class Biased(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bias = nn.Conv2d(3, 4, 3), nn.Parameter(torch.randn(4, 4, 4))
            self.drop, self.head = nn.Dropout(0.3), nn.Linear(64, 3)

        def forward(self, x):
            return self.head((self.conv(x) + self.drop(self.bias)).flatten(1))

    _, _, _, noise = _written(tmp_path, Biased().train(), torch.randn(5, 3, 6, 6), 3)
    assert [tuple(n.shape) for n in noise] == [(4, 4, 4)]


@pytest.mark.parametrize("draw", ["rand", "rand_like", "randn", "randn_like", "bernoulli", "rand_rows"])
def test_a_random_draw_written_by_hand_takes_its_values_from_noise_inputs(tmp_path, draw):
    """A draw that is no dropout (Hugging Face's drop path: ``keep + torch.rand((n, 1, 1, 1))``,
    floored; noise injected with ``randn_like``; a ``bernoulli`` of computed probabilities) is a
    noise input and the operators making the draw, replayed in PyTorch's step for the check (its
    RandomUniformLike sent the model to the traced step: Swin 21x ORT's preparation)."""

    class Drawn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 3), nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            y, n = torch.relu(self.conv(x)), x.shape[0]
            if draw == "rand":
                r = (0.7 + torch.rand((n, 1, 1, 1), dtype=y.dtype, device=y.device)).floor_()
                return self.head((y.div(0.7) * r).flatten(1))
            if draw == "rand_rows":  # two rows a sample
                r = torch.rand((n * 2, 32), dtype=y.dtype)
                return self.head((y.reshape(n * 2, 32) * r).reshape(n, -1))
            if draw == "bernoulli":
                return self.head((y * torch.bernoulli(torch.sigmoid(y).detach())).flatten(1))
            noisy = {"rand_like": torch.rand_like, "randn": lambda t: torch.randn(t.shape),
                     "randn_like": torch.randn_like}[draw](y)  # fmt: skip
            return self.head((y + 0.1 * noisy * y).flatten(1))

    _, _, _, noise = _written(tmp_path, Drawn().train(), torch.randn(5, 3, 6, 6), 3)
    shapes = {"rand": [("batch", 1, 1, 1)], "rand_rows": [("batch", 2, 32)]}
    assert [tuple(n.shape) for n in noise] == shapes.get(
        draw, [("batch", 4, 4, 4)] * (2 if "randn" in draw else 1)
    )


@pytest.mark.parametrize("pool", [nn.AvgPool2d, nn.MaxPool2d])
def test_a_zero_pad_then_a_pool_of_one_element_windows_takes_the_graph_path(tmp_path, pool):
    """Issue 53: a grouped-conv net's shortcut, ZeroPad2d then AvgPool2d(1, stride 2): ONNX Runtime
    fuses the Pad into the pool's pads and refuses the pool ('Pad should be smaller than kernel'),
    so the graph step did not load and the model went to the traced step (11 s against 2).
    Such a pool is the strided Slice it computes."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1, groups=1)
    grouped = nn.Conv2d(4, 4, 3, padding=1, groups=2)
    model = nn.Sequential(conv, nn.ReLU(), grouped, nn.ZeroPad2d((0, 1, 0, 1)), pool(1, stride=2), nn.Flatten(),
                          nn.Linear(4 * 3 * 3, 3)).train()  # fmt: skip
    x = torch.randn(5, 3, 4, 4)
    path, names, y, _ = _written(tmp_path, model, x, 3)  # Unsupported (does not load) would fail here
    _assert_pytorch_s(path, model, x, y, names)
    assert not {"AveragePool", "MaxPool"} & {n.op_type for n in onnx.load(str(path)).graph.node}
