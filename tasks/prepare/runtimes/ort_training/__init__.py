"""The ORT-training runtime on the host (``[training] runtime = "ort-training"``): ONNX
Runtime's training artifacts from the training-mode export (``artifacts``, and ``split_artifacts``
for frozen-prefix caching) through ``generate`` (``onnxruntime.training``'s ``generate_artifacts``).
"""
