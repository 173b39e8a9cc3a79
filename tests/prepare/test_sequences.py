"""Recurrent models (issue 37, item 4): the last LSTM/GRU is the "last layer" of
``last-conv+classifier`` (a bag of embeddings' is its token embedding); a frozen recurrent layer a gradient flows through is refused by its full
module path, with advice that works; recurrent dropout in training mode exports."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from tasks.errors import ModelError, RecipeError
from tasks.prepare.manifest import trainable_layers
from tasks.prepare.trainable import resolve_trainable
from tests.prepare.kit import merge
from tests.prepare.seq_kit import (
    BagNet,
    BagOfIds,
    ConvGRU,
    PackedNet,
    TokenNet,
    export_module,
    signals,
    token_ids,
)


def _trainable(recipe, model, trainable: dict) -> set[str]:
    changed = merge(recipe.raw, {"trainable": {"strategy": None, **trainable}})  # only what the test says
    from tasks.recipe.load import parse_recipe

    return set(resolve_trainable(parse_recipe(changed, recipe.source), model)[0])


def _rnn(layer: int, reverse: bool = False, prefix: str = "rnn") -> set[str]:
    tail = "_reverse" if reverse else ""
    return {f"{prefix}.{k}_l{layer}{tail}" for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"rnn": "gru"}, _rnn(0)),
        ({"rnn": "lstm"}, _rnn(0)),
        ({"rnn": "lstm", "bidirectional": True, "layers": 2}, _rnn(1) | _rnn(1, reverse=True)),
        ({"rnn": "gru", "layers": 2, "dropout": 0.3}, _rnn(1)),
    ],
    ids=["gru", "lstm", "bidirectional-stacked-lstm", "stacked-gru-with-dropout"],
)
def test_last_recurrent_layer_is_the_last_layer_of_the_default_strategy(tmp_path, kwargs, expected):
    module = TokenNet(**kwargs)
    flags = [m.training for m in module.modules()]
    recipe, model = export_module(module, tmp_path, token_ids())  # dropout between layers: exported
    assert [m.training for m in module.modules()] == flags  # the module is left as it was
    chosen = _trainable(recipe, model, {"strategy": "last-conv+classifier"})
    assert chosen == expected | {"fc.weight", "fc.bias"}


def test_a_bag_of_embeddings_trains_its_token_embedding_not_the_positions_or_the_hidden_layer(tmp_path):
    recipe, model = export_module(BagNet(), tmp_path, token_ids())  # was refused: "none on the path"
    chosen = _trainable(recipe, model, {"strategy": "last-conv+classifier"})
    assert chosen == {"emb.weight", "fc.weight", "fc.bias"}


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_an_embedding_bag_exports_without_a_loop_and_trains_its_table(tmp_path, mode):
    import torch.nn.functional as F  # torch (heavy) only in the tests that build a model

    before = F.embedding_bag
    recipe, model = export_module(BagOfIds(mode), tmp_path, token_ids())  # was a Loop reading the table
    assert F.embedding_bag is before  # given back after the export
    assert "Loop" not in {n.op_type for n in model.graph.node}
    chosen = _trainable(recipe, model, {"strategy": "last-conv+classifier"})
    assert chosen == {"bag.weight", "fc.weight", "fc.bias"}


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_the_autograd_runtime_s_export_of_an_embedding_bag_trains_its_table_too(tmp_path, mode):
    import onnx
    import torch

    from tasks.prepare.runtimes.autograd.template import export_inference

    recipe, _ = export_module(BagOfIds(mode), tmp_path, token_ids())
    path = tmp_path / "eval.onnx"  # the autograd runtime's model.onnx: its strategy found no layer
    export_inference(BagOfIds(mode).eval(), (torch.from_numpy(token_ids()),), ["input"], ["logits"], path)
    model = onnx.load(str(path))
    assert "Loop" not in {n.op_type for n in model.graph.node}
    chosen = _trainable(recipe, model, {"strategy": "last-conv+classifier"})
    assert chosen == {"bag.weight", "fc.weight", "fc.bias"}


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_conv_then_recurrent_trains_the_recurrent_layer_not_the_conv(tmp_path, rnn):
    recipe, model = export_module(ConvGRU(rnn), tmp_path, signals())
    chosen = _trainable(recipe, model, {"strategy": "last-conv+classifier"})
    assert chosen == _rnn(0, prefix="encoder.gru") | {"fc.weight", "fc.bias"}
    # the trainable-layer table names the recurrent layer by its operator, not the weight-only
    # Slice/Concat nodes that reorder its gates (issue 53: "Slice")
    counts = {i.name: int(np.prod(i.dims)) for i in model.graph.initializer}
    rows = {r["layer"]: r["ops"] for r in trainable_layers(model, sorted(chosen), counts)}
    assert rows == {"encoder.gru": [rnn.upper()], "fc": ["Gemm"]}, rows
    # a frozen recurrent layer no gradient reaches is fine: the classifier alone
    assert _trainable(recipe, model, {"strategy": "classifier"}) == {"fc.weight", "fc.bias"}


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_frozen_recurrent_layer_between_trainable_ones_is_refused_by_name_with_advice_that_works(
    tmp_path, rnn
):
    recipe, model = export_module(ConvGRU(rnn), tmp_path, signals())
    op, node = rnn.upper(), f"/encoder/gru/{rnn.upper()}"
    with pytest.raises(RecipeError) as caught:
        _trainable(recipe, model, {"patterns": ["encoder.conv.*", "fc.*"]})
    text = str(caught.value)
    assert "\n" not in text and f"the {op} layer 'encoder.gru' (ONNX node '{node}')" in text
    assert "(here encoder.conv)" in text and "(got 'encoder.gru frozen')" in text
    assert "trainable.patterns = ['encoder.gru.*']" in text and f"trainable.train_from = '{node}'" in text
    # the two ways out, as the line spells them
    everything = _trainable(recipe, model, {"patterns": ["encoder.conv.*", "fc.*", "encoder.gru.*"]})
    assert _rnn(0, prefix="encoder.gru") <= everything
    after = _trainable(recipe, model, {"patterns": ["encoder.conv.*", "fc.*"], "train_from": node})
    assert after == {"fc.weight", "fc.bias"}


def test_a_frozen_rnn_between_trainable_layers_is_unrolled_not_refused(tmp_path):
    """ORT has no RNN gradient at all: the RNN is unrolled into plain operators, which pass a
    gradient with their weights frozen (the LSTM/GRU kernels crash there)."""
    from tasks.prepare.rewrites.rnn import rnns_unrolled

    recipe, model = export_module(ConvGRU("rnn"), tmp_path, signals())
    names = ["encoder.conv.weight", "encoder.conv.bias", "fc.weight", "fc.bias"]
    assert _trainable(recipe, model, {"names": names}) == set(names)  # was refused as a frozen RNN
    assert rnns_unrolled(model, names) == 1


def test_partly_frozen_recurrent_layer_is_refused_naming_the_frozen_weights_and_a_frozen_bias_is_not(
    tmp_path,
):
    recipe, model = export_module(ConvGRU("gru"), tmp_path, signals())
    names = ["encoder.conv.weight", "encoder.gru.weight_ih_l0", "fc.weight"]
    with pytest.raises(RecipeError, match=r"encoder.gru partly frozen: \['encoder.gru.weight_hh_l0'\]"):
        _trainable(recipe, model, {"names": names})
    both = [*names, "encoder.gru.weight_hh_l0"]  # W and R train, the biases stay frozen: ORT trains that
    assert _trainable(recipe, model, {"names": both}) == set(both)


def test_exporter_failure_names_the_full_module_path(tmp_path):
    """A layer called ``unit1`` in three stages is named by its whole path, not by ``unit1``."""
    from torch.onnx.errors import UnsupportedOperatorError

    from tasks.prepare.messages import export_failure
    from tests.prepare.kit import tiny_recipe

    scope = (
        "m.Net::/m.Stage::stage2/torch.nn.modules.container.Sequential::blocks/m.Unit::blocks.1/m.Scan::unit1"
    )
    dump = f"  %7 : Float(2, 4), %8 : Long(2, 4) = aten::cummax(%3, %5), scope: {scope} # m.py:3:0\n"
    message = export_failure(tiny_recipe(tmp_path), UnsupportedOperatorError("aten::cummax", 17, None), dump)
    assert "operator cummax in stage2.blocks.1.unit1 (Scan): " in message and "\n" not in message


def test_a_torch_fft_front_end_is_one_line_with_exportable_ways_to_the_spectrum(tmp_path):
    from torch.onnx.errors import UnsupportedOperatorError

    from tasks.prepare.messages import export_failure
    from tests.prepare.kit import tiny_recipe

    dump = "  %7 : ComplexFloat(2, 3, 33) = aten::fft_rfft(%x, %4, %5, %6), scope: m.Net::/m.Front::front # m.py:3:0\n"
    message = export_failure(
        tiny_recipe(tmp_path), UnsupportedOperatorError("aten::fft_rfft", 17, None), dump
    )
    assert "operator fft_rfft in front (Front): " in message and "\n" not in message
    assert message.endswith(
        "compute the spectrum in front without complex tensors: torch.stft(..., return_complex=False), or "
        "products with cos and sin DFT matrices held as registered buffers"
    )


def test_a_packed_sequence_is_one_line_naming_the_recurrent_layer(tmp_path):
    """torch's exporter stops on packed sequences with a C++ range check naming nothing."""
    with pytest.raises(ModelError) as err:
        export_module(PackedNet(), tmp_path, token_ids())
    assert "operator gru in encoder.rnn (GRU): encoder.rnn is fed a packed sequence" in str(err.value)
    assert "read each sequence's last valid step with a gather at lengths - 1" in str(err.value)
    assert "vector::" not in str(err.value) and "\n" not in str(err.value)


class ProjectedLSTM(nn.Module):
    """[N, 3, T] -> a stacked bidirectional LSTM with projections (from a given state) -> Linear."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 8, 2, batch_first=True, bidirectional=True, proj_size=4)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        n = x.shape[0]
        state = (x.new_ones(4, n, 4) * 0.1, x.new_ones(4, n, 8) * -0.1)
        y, (h, c) = self.lstm(x.transpose(1, 2), state)
        return self.fc(y[:, -1]) + h.mean() + c.mean()


def test_an_lstm_with_projections_exports_step_by_step_and_computes_what_torch_does(tmp_path):
    import torch  # torch (heavy) only in the tests that build a model

    from tasks.prepare.graph import quiet_session

    torch.manual_seed(0)
    module = ProjectedLSTM()
    recipe, model = export_module(module, tmp_path, signals())  # was: "LSTMs with projections" unsupported
    assert "forward" not in vars(module.lstm)  # its own forward given back
    x = signals(n=4)
    got = quiet_session(model).run(None, {model.graph.input[0].name: x})[0]
    with torch.no_grad():
        want = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    chosen = _trainable(recipe, model, {"strategy": "last-conv+classifier"})
    assert chosen == {"lstm.weight_ih_l1", "lstm.weight_ih_l1_reverse", "fc.weight", "fc.bias"}
