"""The app settings the compose stack's test puts into its `.env` (each a value other than the default, harmless to
the stack's own checks) and reads back from every service that reads it; and the settings it leaves out, each with
the reason. `tests/test_deploy.py` checks that the two together name every setting there is, so that a new setting
is either checked in the stack or excluded on purpose."""

from __future__ import annotations

# VISIONCAP_* settings of every command (visioncap.config.settings.Settings): the pipeline, the API and the alerts
# service all read them.
SHARED = {
    "VISIONCAP_RETENTION_DAYS": "3650",
    "VISIONCAP_RETENTION_CAMERA_DAYS": '{"door": 3000, "vault": null}',
    "VISIONCAP_RETENTION_MIN_FREE_MB": "1",
    "VISIONCAP_RETENTION_INTERVAL_S": "1800",
    # 10.0.0.0/8 holds podman's default networks, where the test's camera is.
    "VISIONCAP_CAMERA_ALLOWED_HOSTS": "10.0.0.0/8,cam.lan",
}
# `visioncap api`'s own (visioncap.config.api.ApiSettings).
API_ONLY = {
    "VISIONCAP_API_CORS_ORIGINS": '["https://ops.example"]',
    "VISIONCAP_API_MAX_PAGE_SIZE": "150",
    "VISIONCAP_API_MAX_QUERY_LENGTH": "150",
    "VISIONCAP_API_MAX_BODY_BYTES": "70000",
    "VISIONCAP_API_SEARCH_SCAN_ROWS": "20000",
    "VISIONCAP_API_SEARCH_TIMEOUT_S": "3",
    "VISIONCAP_API_EMBED_BATCH": "32",
    "VISIONCAP_API_EMBED_POLL_S": "3",
    "VISIONCAP_API_STREAM_POLL_S": "0.6",
    "VISIONCAP_API_STREAM_HEARTBEAT_S": "20",
    "VISIONCAP_API_MAX_STREAMS": "50",
    "VISIONCAP_API_IMAGE_MAX_AGE_S": "3600",
    "VISIONCAP_ASK_MODEL": "vlm",
    "VISIONCAP_ASK_TIME_ZONE": "Europe/Berlin",
    # Ask's answer is checked non-empty: a random-weight model may end at once without it.
    "VISIONCAP_ASK_EXTRA_BODY": '{"ignore_eos": true}',
    "VISIONCAP_ASK_TOP_K": "6",
    "VISIONCAP_ASK_FRAMES": "2",
    "VISIONCAP_ASK_IMAGE_TOKENS": "256",
    "VISIONCAP_ASK_MIN_SIMILARITY": "0.25",
    "VISIONCAP_ASK_CONTEXT_TOKENS": "4000",
    "VISIONCAP_ASK_MAX_TOKENS": "256",
    "VISIONCAP_ASK_MAX_MESSAGES": "16",
    "VISIONCAP_ASK_MAX_MESSAGE_CHARS": "3000",
    "VISIONCAP_ASK_MAX_TASK_CHARS": "30000",
    "VISIONCAP_ASK_MAX_BODY_BYTES": "900000",
    "VISIONCAP_ASK_TIMEOUT_S": "100",
}
# Not set by the test, and why.
LEFT_OUT = {
    "VISIONCAP_DATA_DIR": "the compose file sets it (/data, the volume); a service's `environment` wins over .env",
    "VISIONCAP_DATABASE_URL": "set: deploy/keys.py --postgres writes it, and every service reaches PostgreSQL by it",
    "VISIONCAP_VLM_BASE_URL": "the compose file sets it (the gateway's address on the compose network)",
    "VISIONCAP_VLM_API_KEY": "the compose file sets it from VISIONCAP_CAPTIONS_KEY (the alerts service's from "
    "VISIONCAP_ALERTS_KEY), which keys.py writes",
    "VISIONCAP_ASK_VLM_API_KEY": "the compose file sets it from VISIONCAP_ASK_KEY, which keys.py writes",
    "VISIONCAP_API_KEYS": "set: keys.py writes it, and the test's every API call uses its key",
    "VISIONCAP_SERVER_PYTHON": "the vLLM server runs in its own container, not from the app's image",
    "VISIONCAP_MODELS_DIR": "the image's profiles folder; the vLLM container takes the profile by VISIONCAP_PROFILE",
    "VISIONCAP_ALERTS_CONFIG": "the compose file mounts the alerts file (VISIONCAP_ALERTS_FILE) where alerts reads it",
    "VISIONCAP_API_PUBLIC_UI": "false would put the web page behind a key, which the test's Chromium check opens",
    "VISIONCAP_API_SEMANTIC_SEARCH": "the embedding model loads on first use: checked by tests/test_semantic.py",
    "VISIONCAP_API_READY_CHECK_VLM": "false would make /readyz, the stack's health check, blind to the VLM",
    "VISIONCAP_ASK_IMAGE_TOKEN_SIZE": "the model's pixels per token (28 for Qwen), not a choice",
}
