"""The autograd training runtime (``[training] runtime = "autograd"``): the train step of the
trainable part comes from PyTorch's autograd as a plain ONNX graph that any ``onnxruntime`` runs.

``build`` (the model's eval-mode export, the artifacts and manifest) over ``steps`` (the train and
eval step files) over ``trace`` (``torch.export`` of the forward, ``make_fx`` of the step),
``decompositions`` and ``op_checks`` (the backward operators PyTorch ships none for, checked
against its kernels), ``noise`` (random draws made inputs), ``losses``, ``onnx_step`` (the ONNX
file, checked against the traced graph) and ``template`` (the inference model the board writes its
weights into). Nothing here imports ``onnxruntime.training``.
"""
