"""Training runs' shared pieces: checkpoints without pickle (weights and AdamW state as
safetensors, the rest JSON) and the learning-rate schedule, so that a resumed run continues
exactly where it stopped; and the lock that keeps one run at a time in a work folder.

A checkpoint is a weights file and an optimizer file of its own names, and ``state.json``,
which names them and the run's fingerprint, so a checkpoint is used only by the same
configuration and data. The two files are written and flushed to disk first; replacing
``state.json`` (atomically, flushed) then switches to them in one step, and only after that
are the previous checkpoint's files removed. A crash at any point leaves one whole checkpoint:
the new one or the previous one, never new weights under an old step.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vecplug.fsutil import WriterLock

def torch_seed(value: int) -> int:
    """``value`` as ``torch.manual_seed`` takes it: that range, [-2**63, 2**64), is kept as it
    is (the runs of every seed that worked stay identical); past it (a large ``seed``, times
    1,000,003 per step) it wraps modulo 2**64 rather than fail after the model has loaded."""
    return value if -(1 << 63) <= value < (1 << 64) else value % (1 << 64)


def numpy_seed(value: int) -> int:
    """``value`` as numpy's generators take it, [0, 2**64): others wrap modulo 2**64 (numpy
    refuses a negative seed, which torch and the config take, after the model has loaded)."""
    return value % (1 << 64)


STATE = "state.json"
#: the files of checkpoints written before they were named by their step
WEIGHTS, OPTIMIZER = "weights.safetensors", "optimizer.safetensors"


def lock(work: Path) -> WriterLock:
    """Hold the work folder ``work`` (made if missing) for this run, or raise
    :class:`~vecplug.errors.IndexLockedError`: two runs of one output shared its checkpoint
    files, deleted each other's, and the second to finish died with a FileNotFoundError
    traceback. Release with :func:`unlock`."""
    from vecplug.errors import IndexLockedError, StorageError
    from vecplug.fsutil import WriterLock

    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot make the work folder {work}: {exc.strerror or exc}") from exc
    held = WriterLock(work)
    try:
        held.acquire()
    except IndexLockedError:
        raise IndexLockedError(f"another run is writing {work} (a run of the same output): wait for it "
                               "to finish, or choose another output") from None
    return held


def unlock(work: Path, held: WriterLock) -> None:
    """Release ``work``; one left holding only its lock (a run refused or failed before its
    first checkpoint) is removed first, while still held, so that no empty folder is left."""
    try:
        if work.is_dir() and {p.name for p in work.iterdir()} <= {held.path.name}:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        held.release()


def save(work: Path, named: dict[str, Any], optimizer: Any, state: dict[str, Any]) -> None:
    """Write ``named`` parameters (name -> tensor), ``optimizer``'s Adam moments and ``state``
    (with ``step``) as the work folder's checkpoint, replacing the previous one."""
    import torch
    from safetensors.torch import save_file

    from vecplug.fsutil import atomic_write_json, fsync_path

    work.mkdir(parents=True, exist_ok=True)
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
    # new names every time (a step saved twice must not overwrite the checkpoint in use)
    tag = f"{state.get('step', 0)}-{os.urandom(4).hex()}"
    files = {"weights": f"weights-{tag}.safetensors", "optimizer": f"optimizer-{tag}.safetensors"}
    save_file({n: p.detach().contiguous() for n, p in named.items()}, str(work / files["weights"]))
    save_file(opt, str(work / files["optimizer"]))
    for name in files.values():
        fsync_path(work / name)  # on disk before the state names them
    atomic_write_json(work / STATE, {**state, "files": files})  # the switch
    for old in work.glob("*.safetensors"):  # the previous checkpoint's, and any a crash left
        if old.name not in files.values():
            old.unlink(missing_ok=True)


def load(work: Path, key: str, named: dict[str, Any], optimizer: Any,
         log: Callable[[str], None] = lambda message: None,
         earlier: Callable[[], Iterable[str]] = tuple) -> dict[str, Any] | None:
    """Restore a checkpoint of the run ``key`` into ``named`` and ``optimizer``; its state, or
    None when there is none (or it belongs to another run, or its files are unreadable: said
    through ``log``, since the run then starts over and replaces it). ``earlier``: the same
    run's keys by the formulas of earlier vecplug versions (their checkpoints resume too),
    computed only for a checkpoint that ``key`` does not name (they hash the data again)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = work / STATE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = None
    if not isinstance(state, dict) or "key" not in state:
        log(f"the checkpoint in {work} is unreadable: starting over")
        return None
    if state.get("key") != key and state.get("key") not in set(earlier()):
        log(f"the checkpoint in {work} (step {state.get('step', '?')}) is of another run: its "
            "configuration or data differ; starting over (this run's first checkpoint replaces it)")
        return None
    files = state.get("files") or {"weights": WEIGHTS, "optimizer": OPTIMIZER}
    try:
        weights = load_file(str(work / files["weights"]))
        saved = load_file(str(work / files["optimizer"])) if os.path.isfile(work / files["optimizer"]) else {}
    except (OSError, SafetensorError, KeyError, TypeError):
        # a damaged checkpoint: the run starts over rather than from wrong weights
        log(f"the checkpoint in {work} is damaged: starting over")
        return None
    with torch.no_grad():
        for n, p in named.items():
            if n in weights:
                p.copy_(weights[n])
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
