"""Starting and stopping the vLLM server from a model profile."""

from visioncap.serve.launcher import VllmServer, free_port
from visioncap.serve.profiles import ModelProfile, load_profile

__all__ = ["ModelProfile", "VllmServer", "free_port", "load_profile"]
