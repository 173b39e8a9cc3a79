"""Offline validation of a prepared recipe, before anything reaches a board: ``validate`` runs
the checks (the data, the torch-free training probe ``ort_probe``, the comparison with PyTorch
``torch_compare``, the rehearsals of retrieval ``rehearse`` and of the teacher ``teacher``).
"""
