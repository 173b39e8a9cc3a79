"""The virtual board (root-only test and demo infrastructure, never used with a real board):
a private sshd with its own user and network namespace (``lifecycle``, ``sshd``), kernel limits
(``cgroup``: RAM cap, CPU quota; ``profiles``: a board model's values), a shaped link (``link``,
``delay_proxy``), link faults (``faults``) and the board-like Python environment: numpy +
onnxruntime-training-cpu, no torch (``venv``)."""
