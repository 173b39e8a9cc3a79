"""The recipe's model on the host: built in PyTorch (``torch_model``, its BatchNorm
calibration, the user's own code) or read from an ONNX file (``onnx_in``), and exported to ONNX
(``torchscript``: the training-mode export of the ORT-training runtime; ``tracing``, ``buffers``,
``priors``: what an export records beside the graph).
"""
