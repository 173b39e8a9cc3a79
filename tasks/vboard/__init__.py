"""The virtual board (root-only test and demo infrastructure, never used with a real board):
a private sshd with its own user and network namespace (``board``), link faults (``faults``) and
the board-like Python environment: numpy + onnxruntime-training-cpu, no torch (``venv``)."""
