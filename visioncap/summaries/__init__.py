"""Summaries of a window of captions written by the VLM, on request and as scheduled digests."""
