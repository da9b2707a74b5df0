"""Configuration models: one module per area, all strict (unknown keys are errors)."""

from visioncap.config.caption import CaptionConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.outbox import OutboxConfig
from visioncap.config.pipeline import PipelineConfig, load_pipeline
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig, FolderSourceConfig, SourceConfig, StreamSourceConfig
from visioncap.config.vlm import VlmConfig

__all__ = [
    "CaptionConfig",
    "DetectorConfig",
    "FileSourceConfig",
    "FolderSourceConfig",
    "OutboxConfig",
    "PipelineConfig",
    "SelectionConfig",
    "SourceConfig",
    "StreamSourceConfig",
    "VlmConfig",
    "load_pipeline",
]
