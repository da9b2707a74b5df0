"""Starting and stopping the vLLM server from a model profile (the profiles themselves: visioncap.config.profiles)."""

from visioncap.serve.launcher import VllmServer
from visioncap.serve.ports import PortTakenError, check_own, free_port

__all__ = ["PortTakenError", "VllmServer", "check_own", "free_port"]
