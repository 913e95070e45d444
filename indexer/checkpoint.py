"""Training runs' shared pieces: checkpoints without pickle (weights and AdamW state as
safetensors, the rest JSON) and the learning-rate schedule, so that a resumed run continues
exactly where it stopped.

A checkpoint is three files in a work folder; ``state.json`` is written last and names the
run's fingerprint, so a checkpoint is used only by the same configuration and data, and a
crash while writing leaves the previous checkpoint whole.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATE, WEIGHTS, OPTIMIZER = "state.json", "weights.safetensors", "optimizer.safetensors"


def save(work: Path, named: dict[str, Any], optimizer: Any, state: dict[str, Any]) -> None:
    """Write ``named`` parameters (name -> tensor), ``optimizer``'s Adam moments and ``state``."""
    import torch
    from safetensors.torch import save_file

    work.mkdir(parents=True, exist_ok=True)
    save_file({n: p.detach().contiguous() for n, p in named.items()}, str(work / "weights.tmp"))
    ids = {id(p): n for n, p in named.items()}
    opt: dict[str, Any] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p)
            if not st or id(p) not in ids:
                continue
            n = ids[id(p)]
            step = st["step"]
            opt[f"{n}.step"] = (step.reshape(1).float() if torch.is_tensor(step)
                                else torch.tensor([float(step)]))
            opt[f"{n}.exp_avg"] = st["exp_avg"].contiguous()
            opt[f"{n}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
    save_file(opt, str(work / "optimizer.tmp"))
    (work / "weights.tmp").replace(work / WEIGHTS)
    (work / "optimizer.tmp").replace(work / OPTIMIZER)
    tmp = work / "state.tmp"
    tmp.write_text(json.dumps(state))
    tmp.replace(work / STATE)  # last: the state names a complete checkpoint


def load(work: Path, key: str, named: dict[str, Any], optimizer: Any) -> dict[str, Any] | None:
    """Restore a checkpoint of the run ``key`` into ``named`` and ``optimizer``; its state, or
    None when there is none (or it belongs to another run)."""
    import torch
    from safetensors.torch import load_file

    try:
        state = json.loads((work / STATE).read_text())
    except (OSError, ValueError):
        return None
    if state.get("key") != key or not (work / WEIGHTS).is_file():
        return None
    weights = load_file(str(work / WEIGHTS))
    with torch.no_grad():
        for n, p in named.items():
            if n in weights:
                p.copy_(weights[n])
    saved = load_file(str(work / OPTIMIZER)) if (work / OPTIMIZER).is_file() else {}
    for n, p in named.items():
        if f"{n}.exp_avg" in saved:
            optimizer.state[p] = {"step": saved[f"{n}.step"].reshape(()), "exp_avg": saved[f"{n}.exp_avg"],
                                  "exp_avg_sq": saved[f"{n}.exp_avg_sq"]}
    return state


def learning_rate(step: int, total: int, base: float, warmup: float) -> float:
    """Linear warm-up over the first ``warmup`` share of ``total`` steps, then linear decay to
    zero: a function of the step alone, so a resumed run needs no scheduler state."""
    w = max(1, int(total * warmup))
    if step < w:
        return base * (step + 1) / w
    return base * max(0.0, (total - step) / max(1, total - w))
