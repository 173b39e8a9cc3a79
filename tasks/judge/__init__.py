"""Judging a trained model on the host: evaluation on the test sets (``evaluate``, on ONNX Runtime via
``runtime``) reporting the recipe's own loss (``losses``), board vs host agreement (``agreement``),
the model registry and the promotion decision (``registry``), the markdown report (``report``,
``charts``)."""
