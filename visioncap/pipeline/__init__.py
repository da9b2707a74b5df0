"""Runs a pipeline: source -> detect -> select -> caption -> store."""

from visioncap.pipeline.runner import PipelineRunner, RunSummary

__all__ = ["PipelineRunner", "RunSummary"]
