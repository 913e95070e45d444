"""Students that share their first layers with the teacher: the teacher goes on from there.

A student distilled with ``shared_layers: n`` (``vecplug distill --shared-layers N``) runs the
teacher's own embeddings and first ``n`` layers, frozen, then layers of its own. Its hidden
state after layer ``n`` is therefore the teacher's, and the teacher reranker need not encode
the query again: it runs the teacher's layers ``n`` and above on the state the student kept
(an early exit read the other way round). A reranked query then costs the student plus the
teacher's upper layers, not the student plus the whole teacher.

The pieces here work on any BERT-style Hugging Face model (``embeddings``, ``encoder.layer``):
views of a model that run some of its layers (sharing, never copying, their modules, so a
quantised model's views are quantised too), and the student's forward pass split in two.
"""
from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

#: the most tokens a query encoder keeps shared states for per ``encode`` call (per thread):
#: 262,144 x 384 float32 is 384 MB, enough for XQuAD-R's 7,140 questions in one batch; the
#: queries of a larger call are continued from their states only up to it (the others are
#: encoded again by the teacher, as without a shared-layer student)
KEEP_TOKENS = 262_144


def layer_view(model: Any, start: int, stop: int | None = None) -> Any:
    """``model`` running only its layers ``start:stop``: from the token ids (with its
    embeddings) when ``start`` is 0, else from a hidden state given as ``inputs_embeds``.

    A shallow copy: the layers are the model's own modules (quantised, converted to bfloat16
    or not, as the model is), so a view costs no memory. The model's forward pass is kept as
    it is (attention masks built as it builds them); only its layer list and, above layer 0,
    its embeddings (which would add position embeddings to the state again) are replaced.
    """
    import torch

    from vecplug.indexer.student import _encoder_layers

    view = copy.copy(model)
    view._modules = dict(model._modules)
    encoder = copy.copy(model.encoder)
    encoder._modules = dict(model.encoder._modules)
    encoder._modules["layer"] = torch.nn.ModuleList(list(_encoder_layers(model))[start:stop])
    view._modules["encoder"] = encoder
    if start > 0:
        view._modules["embeddings"] = _pass_through()
    return view


def _pass_through() -> Any:
    """Embeddings that return the hidden state given as ``inputs_embeds`` unchanged."""
    import torch

    class PassThrough(torch.nn.Module):
        def forward(self, *args: Any, inputs_embeds: Any = None, **kwargs: Any) -> Any:
            return inputs_embeds

    return PassThrough()


def split_forward(model: Any, shared: int) -> Any:
    """A module (input ids, mask) -> (last hidden state, hidden state after layer ``shared``):
    the model's own forward pass, in two views (traceable as one graph)."""
    import torch

    lower, upper = layer_view(model, 0, shared), upper_forward(model, shared)

    class Split(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lower, self.upper = lower, upper

        def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
            state = self.lower(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self.upper(state, attention_mask), state

    return Split().eval()


def upper_forward(model: Any, start: int) -> Any:
    """A module (hidden state, mask) -> last hidden state: ``model``'s layers from ``start`` on."""
    import torch

    upper = layer_view(model, start)

    class UpperLayers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.upper = upper

        def forward(self, state: Any, attention_mask: Any) -> Any:
            return self.upper(inputs_embeds=state, attention_mask=attention_mask).last_hidden_state

    return UpperLayers().eval()


class Upper:
    """A model's layers from ``start`` on, for :meth:`TextEncoder.continue_from
    <vecplug.indexer.encoder.TextEncoder.continue_from>`: eager at first, traced once it has
    run ``trace_after`` small batches (as a query encoder's whole model is: ``indexer.traced``)."""

    def __init__(self, model: Any, start: int) -> None:
        import torch

        self.module = upper_forward(model, start)
        #: what the layers take: the embeddings' output dtype (bfloat16 in a model converted
        #: to it, float32 otherwise, quantised or not)
        with torch.inference_mode():
            self.dtype = model.embeddings(input_ids=torch.zeros((1, 2), dtype=torch.long)).dtype
        self.dim = int(model.config.hidden_size)
        self.graph: Any = None
        self.calls = 0

    def count_small(self, trace_after: int, lock: Any) -> None:
        """Count a small forward pass; trace at the ``trace_after``-th."""
        with lock:
            self.calls += 1
            due = self.calls == trace_after
        if due:
            self._trace()

    def _trace(self) -> None:
        """Trace on random states of two padded shapes (the check compares graph and eager)."""
        import torch

        from vecplug.indexer.models import LOAD_LOCK
        from vecplug.indexer.traced import trace

        generator = torch.Generator().manual_seed(0)

        def example(rows: int, tokens: int) -> tuple[Any, np.ndarray]:
            mask = np.ones((rows, tokens), dtype=np.int64)
            mask[0, tokens // 2:] = 0
            return torch.randn((rows, tokens, self.dim), generator=generator).to(self.dtype), mask

        with LOAD_LOCK:  # tracing silences warnings process-wide (warnings.catch_warnings)
            self.graph = trace(None, example(2, 8), example(3, 5), forward=self.module)

    def __call__(self, state: Any, mask: Any) -> Any:
        return (self.graph if self.graph is not None else self.module)(state, mask)


class KeptStates:
    """The shared-layer states of a query encoder's last ``encode`` call, per thread, by
    token ids: what :meth:`vecplug.indexer.encoder.Encoder.teacher_vectors` continues from.
    A thread's next call replaces them (a search encodes its queries, then reranks them, in one
    thread); at most :data:`KEEP_TOKENS` tokens are kept per call."""

    def __init__(self) -> None:
        self._local = threading.local()

    def begin(self) -> None:
        self._local.states, self._local.tokens = {}, 0

    def add(self, input_ids: np.ndarray, mask: np.ndarray, state: Any) -> None:
        """Keep each row's state over its real tokens (copied out of the padded batch)."""
        states = getattr(self._local, "states", None)
        if states is None:
            return
        lengths = mask.sum(axis=1)
        for row, n in enumerate(lengths.tolist()):
            if self._local.tokens + n > KEEP_TOKENS:
                return
            states[tuple(input_ids[row, :n].tolist())] = state[row, :n].clone()
            self._local.tokens += n

    def get(self, ids: Sequence[int]) -> Any:
        """The state kept for these token ids in this thread, or None."""
        return getattr(self._local, "states", {}).get(tuple(ids))
