"""A traced TorchScript graph of a transformer's forward pass, for the torch runtime.

Much of a short query's encode in eager torch is Python: each of the hundreds of operations
of a forward pass is dispatched from Python, and for a query of ~20 tokens that costs about as
much as the arithmetic. A graph traced once runs the same operations (the same kernels, the
same vectors in the tests) without that overhead. In the README's query-latency run the shipped
student's int8 encode took 45% less time traced than eager, interleaved query by query.

Tracing costs a forward pass and ~0.4 s (the student), so it is done only once an encoder has
shown it is long-lived and latency-bound: :data:`TRACE_AFTER` forward passes of at most
:data:`SMALL_FORWARD_TOKENS` tokens. A one-shot ``vecplug search`` never pays it; a server or an
API loop does once. A batch of documents (8,192 tokens) is not counted: its per-operation
overhead is a few milliseconds against seconds of arithmetic. A trace records one path through
the model's Python: a branch on a shape or a value would be frozen. So the graph is kept only
if it gives the eager model's output on a batch of another shape, padding included; a model it
does not fit (or a torch without TorchScript) stays eager, as does every encoder with
``model.trace: false``.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np

#: the small forward passes an encoder runs eagerly before tracing its model
TRACE_AFTER = 3
#: a forward pass of at most this many tokens (padded) counts as small: there the overhead is
#: a large share (a single query: ~20 tokens), at 8,192 a fraction of a percent
SMALL_FORWARD_TOKENS = 512
#: what the graph is traced on, and checked on: padded batches of two sizes and lengths
TRACE_TEXTS = (("a short text", "a few more words than the other one, in a padded batch"),
               ("ein Satz", "un texte un peu plus long que le premier", "这是第三个句子，长度又不一样"))
#: how far the traced graph's output may be from the eager model's (the same kernels give 0)
TOLERANCE = 1e-4

log = logging.getLogger(__name__)


def _forward(model: Any) -> Any:
    """The model's forward pass as a module (input ids, mask) -> last hidden state: what is traced."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Forward(model).eval()


def trace(model: Any, example: tuple[Any, np.ndarray], check: tuple[Any, np.ndarray],
          forward: Any = None) -> Any | None:
    """``model``'s forward traced on ``example`` (input ids, mask): a callable (ids, mask tensors)
    -> last hidden state, or None when tracing fails or the graph's output on ``check`` (a batch
    of another shape) is not the eager model's. ``forward``: another module to trace instead,
    taking (first input, mask) and giving one tensor or a tuple of them (each checked), such as
    ``indexer.cascade``'s split forward pass and upper layers (whose first input is a hidden
    state: a tensor rather than an array)."""
    import torch

    from vecplug.indexer.models import quiet_transformers

    forward = _forward(model) if forward is None else forward
    first, mask = (torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in example)
    check_first, check_mask = (torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in check)
    try:
        # outside inference mode: a graph traced inside it holds inference tensors
        # quiet_transformers: the trace walks the model's attributes, and transformers' loss
        # property logs "loss_type=None ... ForCausalLMLoss" on an encoder
        with warnings.catch_warnings(), quiet_transformers(), torch.inference_mode(False), torch.no_grad():
            # TracerWarnings name the branches frozen (the check below is what decides), and
            # torch marks TorchScript as deprecated; neither is the user's business
            warnings.simplefilter("ignore")
            graph = torch.jit.trace(forward, (first, mask), check_trace=False, strict=False)
            real = check_mask.unsqueeze(-1).bool()  # padding positions may differ: not compared
            traced, eager = graph(check_first, check_mask), forward(check_first, check_mask)
            pairs = zip(traced, eager) if isinstance(eager, tuple) else [(traced, eager)]
            gap = max(float(((a.float() - b.float()).abs() * real).max()) for a, b in pairs)
    except Exception as exc:  # noqa: BLE001 - any failure means: stay eager
        log.debug("model not traced: %s", exc)
        return None
    if not gap <= TOLERANCE:  # also NaN
        log.debug("model not traced: its graph is %.3g from the eager model on another shape", gap)
        return None
    return graph
