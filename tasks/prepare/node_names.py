"""What an exporter's node name says: the PyTorch module (the layer) a node comes from."""

from __future__ import annotations


def layer_of(node_name: str) -> str:
    """The PyTorch module path of an exporter node name.

    ``/features/features.1/block/block.1/fc2/Conv`` -> ``features.1.block.1.fc2``: each scope is a
    child's name, and a Sequential's children are spelled ``<parent>.<index>``.
    """
    scopes = [p for p in node_name.split("/") if p][:-1]
    if not scopes:
        return node_name
    path, prev = [], ""
    for scope in scopes:
        path.append(scope[len(prev) + 1 :] if prev and scope.startswith(prev + ".") else scope)
        prev = scope
    return ".".join(path)
