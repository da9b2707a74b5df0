"""Starting and stopping the vLLM server from a model profile (the profiles themselves: visioncap.config.profiles)."""

from visioncap.serve.launcher import VllmServer, free_port

__all__ = ["VllmServer", "free_port"]
