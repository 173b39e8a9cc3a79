"""Judging a trained model on the host: evaluation on the test sets (``evaluate``), the model
registry and the promotion decision (``registry``), the markdown report (``report``, ``charts``)."""
