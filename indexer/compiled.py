"""``model.compile``: a document encoder's forward pass compiled by ``torch.compile`` (Inductor).

On a CPU whose matrix units make the products cheap (AMX: bfloat16 and int8 tiles), a batch of
documents spends much of its time in passes over memory between them: casts, the quantisation
of int8 layers' inputs, GELU, layer norms, residual additions. Inductor fuses such chains into
generated C++ loops, and with ``freezing`` folds the weights in as constants (packed once for
oneDNN). README "Speed" has the figures (``benchmarks/int8_documents.py --compile``).

What it costs, hence opt-in: a C++ compiler at run time (gcc or clang, as Inductor finds
them), and a compilation on the first batch (30-40 s for me5-small on 2 cores; the artefacts
are cached in ``$VECPLUG_HOME/cache/inductor`` unless ``TORCHINDUCTOR_CACHE_DIR`` says
otherwise, which saves a later process little: most of the time is tracing and lowering, not
the C++ compiler). Shapes are dynamic: batches of any size and length reuse the
graph. Only document batches are compiled (queries, one short text at a time, have their
traced graph: ``indexer.traced``). A model Inductor cannot compile, or a machine without a
compiler, keeps the eager model: the failure is logged once as a warning, and the vectors are
the same either way (within rounding: tested).
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any

log = logging.getLogger(__name__)

#: the environment variable naming Inductor's cache folder
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache() -> str:
    """Where Inductor keeps what it compiles: ``TORCHINDUCTOR_CACHE_DIR`` if the user set it,
    else ``$VECPLUG_HOME/cache/inductor`` (set in this process's environment, where torch reads
    it at each compilation)."""
    from vecplug.indexer.models import vecplug_home

    current = os.environ.get(CACHE_VARIABLE)
    # torch writes its default (a folder in /tmp) into the variable the first time it asks,
    # which some imports do: that value is torch's, not the user's, and is replaced too
    if current is None or os.path.abspath(current) == _torch_default():
        os.environ[CACHE_VARIABLE] = str(vecplug_home() / "cache" / "inductor")
    return os.environ[CACHE_VARIABLE]


def _torch_default() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # a torch that keeps it elsewhere: only an unset variable is ours to set
        return None
    return os.path.abspath(default_cache_dir())


def _freezing() -> Any:
    """Inductor's ``freezing`` on for a compiled call (a context manager).

    Freezing makes the weights constants of the graph (an inference model's never change), so
    Inductor packs them once and folds what depends on them alone; int8 layers (oneDNN's
    product) compile only so. Compilation happens inside a call, and torch.compile's own
    ``options`` did not reach this setting in time (torch 2.13: the int8 graph failed), so it
    is patched around the call. torch keeps Inductor's settings per thread (context
    variables), so the patch touches the calling thread only, whatever others do meanwhile."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


class CompiledForward:
    """``model``'s forward pass on (input ids, mask), compiled on first call; eager from the
    first failure on (no compiler, an operation Inductor refuses), with one warning."""

    def __init__(self, model: Any) -> None:
        import torch

        self.model = model
        inductor_cache()
        # Inductor's own lowering of oneDNN's int8 product copies a tensor with torch.tensor()
        # and says so on every compilation: a note to torch's developers, not to our users
        warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning,
                                module=r"torch\._inductor\.")
        self.compiled: Any = torch.compile(model, dynamic=True)
        self._lock = threading.Lock()

    def __call__(self, ids: Any, mask: Any) -> Any:
        """The last hidden states of ``model(input_ids=ids, attention_mask=mask)``."""
        compiled = self.compiled
        if compiled is not None:
            try:
                with _freezing():
                    return compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            except Exception as exc:  # noqa: BLE001 (compiler errors come in many types)
                with self._lock:
                    if self.compiled is not None:
                        log.warning("torch.compile failed on %s (%s: %s); the model runs eagerly",
                                    type(self.model).__name__, type(exc).__name__, str(exc).strip()[:300])
                        self.compiled = None
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state
