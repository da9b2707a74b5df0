"""Captioning: frames to JPEG, JPEG to text through an OpenAI-compatible VLM."""

from visioncap.caption.client import VlmCaptioner
from visioncap.caption.encode import encode_jpeg

__all__ = ["VlmCaptioner", "encode_jpeg"]
