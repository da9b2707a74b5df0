"""Structured captions: the JSON schema goes to vLLM as response_format and its guided decoding enforces it."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import TINY_MODEL

from visioncap.caption.client import CaptionError, VlmCaptioner
from visioncap.caption.encode import encode_jpeg
from visioncap.caption.structured import WORST_CASE_TOKENS, StructuredCaption, response_format
from visioncap.config import CaptionConfig, VlmConfig
from visioncap.serve import VllmServer

FRAME = np.random.default_rng(3).integers(0, 255, (240, 320, 3), dtype=np.uint8)


def test_structured_caption_matches_the_schema(vllm_server: VllmServer) -> None:
    caption_config = CaptionConfig(structured=True, max_tokens=WORST_CASE_TOKENS, max_image_tokens=64)
    captioner = VlmCaptioner(VlmConfig(model=TINY_MODEL), caption_config, vllm_server.base_url, "k")
    caption = captioner.caption(encode_jpeg(FRAME, max_tokens=64).jpeg)
    assert caption.structured is not None
    parsed = StructuredCaption.model_validate(caption.structured)
    assert caption.text == parsed.summary
    assert set(caption.structured) == {"people_count", "activities", "attributes", "summary"}


def test_truncated_json_is_a_clear_permanent_error(vllm_server: VllmServer) -> None:
    # Too few tokens to close the JSON object: the answer cannot be valid, and retrying would not help.
    caption_config = CaptionConfig.model_construct(
        **{**CaptionConfig(max_image_tokens=64).__dict__, "structured": True, "max_tokens": 3}
    )
    captioner = VlmCaptioner(VlmConfig(model=TINY_MODEL), caption_config, vllm_server.base_url, "k")
    with pytest.raises(CaptionError, match="structured caption does not match the schema"):
        captioner.caption(encode_jpeg(FRAME, max_tokens=64).jpeg)


def test_schema_bounds_every_string() -> None:
    schema = response_format()["json_schema"]["schema"]
    assert schema["properties"]["summary"]["maxLength"] == 300
    assert schema["properties"]["activities"]["items"]["maxLength"] == 40
    assert schema["additionalProperties"] is False


def test_config_refuses_too_few_tokens_for_the_json() -> None:
    with pytest.raises(ValueError, match="structured captions need max_tokens >="):
        CaptionConfig(structured=True, max_tokens=100)
