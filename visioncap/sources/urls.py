"""Stream URLs as they may appear in logs, stored rows and API answers: credentials masked.

The masking itself lives in `visioncap.redact`: the error classes (and so config loading) use it too, and
importing it, unlike this package, loads no OpenCV.
"""

from __future__ import annotations

from visioncap.redact import mask_credentials, mask_urls

__all__ = ["mask_credentials", "mask_urls"]
