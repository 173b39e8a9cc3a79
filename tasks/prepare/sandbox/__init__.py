"""Preparation's ONNX Runtime runs, each in a child process: ``ort_child`` and ``ort_parent``
(the child and its parent side), ``supervise`` (a supervised stage and its graph runs),
``child_call`` (a library call in a child), and the one line that says how a run died
(``crash_site``, ``probe_failures``): a graph that kills ONNX Runtime kills the child, not ``odl``.
"""
