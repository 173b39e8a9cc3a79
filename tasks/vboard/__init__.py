"""The virtual board (root-only test and demo infrastructure, never used with a real board):
a private sshd with its own user and network namespace (``lifecycle``, ``sshd``), kernel limits
(``cgroup``: RAM cap, CPU quota; ``profiles``: a board model's values), a shaped link (``link``,
``delay_proxy``), link faults (``faults``) and the board-like Python environment, no torch
(``boardenv``: which one; ``venv``: x86_64 venvs of numpy + onnxruntime-training-cpu or a plain
onnxruntime; ``arm64``: an arm64 Debian userland run by qemu user mode as a Cortex-A35)."""
