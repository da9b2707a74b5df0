"""Captioning: frames to JPEG (encode), JPEG to text through an OpenAI-compatible VLM (client), structured
captions (structured).

Nothing is imported here: configuration validation reads `structured` alone, and the client pulls in the openai
SDK (a second of imports) that a command reporting a configuration error never needs.
"""
