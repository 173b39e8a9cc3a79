"""What tracing a PyTorch model in training mode changes, and how to give it back: module flags,
BatchNorm momentum and statistics, rebound parameters; the auxiliary outputs some models add in
training mode; and what is traced another way than the exporter's own (bags of embeddings, LSTMs
with projections)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any


def has_auxiliary_outputs(model: Any, inputs: tuple[Any, ...], n_eval: int) -> bool:
    """True when the model's own forward returns more in training mode than in eval mode.

    Inception v3 and GoogLeNet add auxiliary classifiers when ``self.training``; at small inputs
    their auxiliary branch cannot even run, which also counts. Only models whose top-level forward
    reads ``self.training`` are run a second time.
    """
    import torch  # torch (heavy) only when a PyTorch model is built or run

    try:
        source = inspect.getsource(type(model))
    except (OSError, TypeError):
        return False
    if "self.training" not in source:
        return False
    with restored(model), torch.no_grad():
        model.train()
        try:
            out = model(*inputs)
        except Exception:  # noqa: BLE001 - a branch that only runs in training mode cannot run here
            return True
    return len(out) > n_eval if isinstance(out, (tuple, list)) else False


@contextlib.contextmanager
def restored(model: Any) -> Iterator[None]:
    """Give ``model`` back as it was when the block ends, also on an error.

    Each module gets back its ``training`` flag, its ``momentum``, its own parameter and buffer
    objects (one rebound in ``forward`` is put back) and the values they held (in-place updates
    such as BatchNorm running statistics and ``num_batches_tracked`` are undone).
    """
    import torch  # torch (heavy) only when a PyTorch model is built or run

    saved = [(m, _attrs(m), dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    tensors = [t for *_, ps, bs in saved for t in (*ps.values(), *bs.values()) if t is not None]
    values = {id(t): (t, t.detach().clone()) for t in tensors}
    try:
        yield
    finally:
        with torch.no_grad():
            for m, attrs, params, buffers in saved:
                m.__dict__.update(attrs)
                _put_back(m._parameters, params)
                _put_back(m._buffers, buffers)
            for tensor, value in values.values():
                tensor.copy_(value)


def _put_back(store: Any, saved: dict[str, Any]) -> None:
    """Make a module's parameter or buffer dict hold exactly ``saved`` again (if ``forward`` changed it)."""
    if len(store) != len(saved) or any(store.get(k) is not v for k, v in saved.items()):
        store.clear()
        store.update(saved)


def _attrs(module: Any) -> dict[str, Any]:
    """The plain attributes export changes: ``training`` and (BatchNorm's) ``momentum``."""
    return {k: module.__dict__[k] for k in ("training", "momentum") if k in module.__dict__}


def channel_dropout_modules(model: Any) -> list[tuple[str, Any]]:
    """(module path, module) of the submodules that drop whole channels (``Dropout1d/2d/3d``,
    ``FeatureAlphaDropout``): the exporter has no ``feature_dropout`` in training mode, even at p = 0,
    so they are exported in eval mode (no channel dropout while fine-tuning)."""
    import torch  # torch (heavy) only when a PyTorch model is exported

    kinds = (torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.FeatureAlphaDropout)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]


def model_outputs(out: Any) -> list[Any]:
    """A forward's outputs as the exporter flattens them: a tuple's or list's items, a dict's values
    (torchvision's segmentation models return ``{"out": ...}``), or the one tensor."""
    out = tuple(out.values()) if isinstance(out, dict) else out
    return list(out) if isinstance(out, (tuple, list)) else [out]


@contextlib.contextmanager
def bags_as_embeddings() -> Iterator[None]:
    """While the block runs, ``F.embedding_bag`` of bags of one length (``nn.EmbeddingBag`` on 2-D
    ids: no offsets, per-sample weights, padding id or max norm) is the embedding reduced over each
    bag: the same values, traced as Gather + ReduceMean/ReduceSum/ReduceMax instead of the
    exporter's Loop, whose body reads the table (ONNX Runtime's training graph cannot build a
    gradient for a parameter read inside a Loop: 'not output of any previous nodes')."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    functional = torch.nn.functional
    original = functional.embedding_bag

    def bag(
        ids: Any, weight: Any, offsets: Any = None, max_norm: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        options = dict(zip(("norm_type", "scale_grad_by_freq", "mode", "sparse", "per_sample_weights",
                            "include_last_offset", "padding_idx"), args, strict=False), **kwargs)  # fmt: skip
        plain = options.get("per_sample_weights") is None and options.get("padding_idx") is None
        if ids.dim() != 2 or offsets is not None or max_norm is not None or not plain:
            return original(ids, weight, offsets, max_norm, *args, **kwargs)
        vectors = functional.embedding(ids, weight)
        mode = options.get("mode", "mean")
        return vectors.mean(1) if mode == "mean" else vectors.sum(1) if mode == "sum" else vectors.amax(1)

    functional.embedding_bag = bag
    try:
        yield
    finally:
        functional.embedding_bag = original


def _projected_lstm(lstm: Any, x: Any, hx: Any) -> tuple[Any, tuple[Any, Any]]:
    """``nn.LSTM`` with ``proj_size`` written step by step: per layer and direction the gates of
    ``x_t W_ih^T + b_ih + h W_hh^T + b_hh``, ``c = f c + i g`` and ``h = (o tanh(c)) W_hr^T``
    (no dropout between layers, as the export of any LSTM). The input projection of both
    directions is one MatMul over the whole sequence, so the layer still shows as one layer over
    steps (``last-conv+classifier`` trains its input weights)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    seq = x.transpose(0, 1) if lstm.batch_first else x  # [T, N, features]
    dirs, n = 2 if lstm.bidirectional else 1, seq.shape[1]
    if hx is None:
        h0 = seq.new_zeros(lstm.num_layers * dirs, n, lstm.proj_size)
        c0 = seq.new_zeros(lstm.num_layers * dirs, n, lstm.hidden_size)
    else:
        h0, c0 = hx
    last_h, last_c = [], []
    for layer in range(lstm.num_layers):
        outs, tails = [], ["", "_reverse"][:dirs]
        both = torch.cat([getattr(lstm, f"weight_ih_l{layer}{tail}") for tail in tails])  # one MatMul
        inputs = torch.matmul(seq, both.t()).chunk(dirs, dim=-1)
        for d, tail in enumerate(tails):
            w = {k: getattr(lstm, f"{k}_l{layer}{tail}", None) for k in ("weight_hh", "weight_hr", "bias_ih",
                                                                            "bias_hh")}  # fmt: skip
            projected = inputs[d]
            if w["bias_ih"] is not None:
                projected = projected + w["bias_ih"] + w["bias_hh"]
            h, c, steps = h0[layer * dirs + d], c0[layer * dirs + d], []
            for t in reversed(range(seq.shape[0])) if d else range(seq.shape[0]):
                i, f, g, o = (projected[t] + h @ w["weight_hh"].t()).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = (torch.sigmoid(o) * torch.tanh(c)) @ w["weight_hr"].t()
                steps.append(h)
            outs.append(torch.stack(steps[::-1] if d else steps))
            last_h.append(h)
            last_c.append(c)
        seq = torch.cat(outs, dim=-1)
    out = seq.transpose(0, 1) if lstm.batch_first else seq
    return out, (torch.stack(last_h), torch.stack(last_c))


@contextlib.contextmanager
def projected_lstms_unrolled(model: Any) -> Iterator[int]:
    """While the block runs, every ``nn.LSTM`` of ``model`` with ``proj_size`` (which torch's
    exporter refuses: 'LSTMs with projections') computes step by step (:func:`_projected_lstm`) on
    a padded batch; yields how many. Each module's own forward is given back at the end."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    found = [m for m in model.modules() if isinstance(m, torch.nn.LSTM) and m.proj_size > 0]
    for m in found:
        m.forward = lambda x, hx=None, m=m: (
            _projected_lstm(m, x, hx)
            if isinstance(x, torch.Tensor) and x.dim() == 3
            else type(m).forward(m, x, hx)
        )
    try:
        yield len(found)
    finally:
        for m in found:
            del m.forward
