"""The ODL device agent: runs training jobs on the board with numpy and ONNX Runtime only.

Must never import torch, prefect, fabric, paramiko or the host's packages.
"""

from device_agent.protocol import AGENT_VERSION, PROTOCOL_VERSION

__all__ = ["AGENT_VERSION", "PROTOCOL_VERSION"]
