"""Graph rewrites of an exported model: the fix-ups that let ONNX Runtime 1.19.2's gradient
builder differentiate what users export (``fixups`` applies ``decompose``, ``pooling``, ``resize``,
``rnn``, ``lstm``, ``conv_transpose``, ``batchnorm``, with the tools of ``rewrite_kit``), and what
the board trains read through the graph (``param_chains``, ``recurrent``).
"""
