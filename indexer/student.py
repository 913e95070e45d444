"""Query students: small encoders distilled from a document encoder (the teacher).

A student is the teacher's embeddings plus a subset of its layers, trained so that its query
vectors match the teacher's. The vocabulary table (250k x 384 for me5-small) is most of a
multilingual encoder's size; a student shares it with its teacher, frozen, so a student folder
holds only what differs::

    config.json          the student's transformer config (fewer layers)
    student.safetensors  every weight except the shared word-embedding table
    student.json         teacher spec and checksum, chosen layers, prefixes, training record

Loading a student loads the table from its teacher and refuses a teacher whose checksum
differs from the one recorded.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vecplug.errors import ModelError, ModelMismatchError

STUDENT_META = "student.json"
STUDENT_WEIGHTS = "student.safetensors"
#: optional lower dimension: the documents' PCA (mean, components) and the student's head
PROJECTION = "projection.safetensors"
SHARED_KEY = "embeddings.word_embeddings.weight"


def is_student_folder(folder: Path) -> bool:
    return (folder / STUDENT_META).is_file() and (folder / STUDENT_WEIGHTS).is_file()


def read_student_meta(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / STUDENT_META).read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{folder / STUDENT_META} is unreadable: {exc}") from exc


def pick_layers(n_teacher: int, k: int, how: str = "spread", shared: int = 0) -> list[int]:
    """Which teacher layers initialise a k-layer student.

    ``first``: layers 0..k-1. ``spread``: evenly spaced from the first to the last layer
    (e.g. 0, 6, 11 of 12), which keeps the teacher's top layer, whose output space the
    student must match; measured far better than the first k layers for me5-small.
    ``shared`` layers come first, the teacher's own 0..shared-1, and ``how`` chooses the
    others among the layers above them (spread: e.g. 0-5 and 11 for k=7, shared=6).
    """
    if not 1 <= k <= n_teacher:
        raise ModelError(f"a student needs between 1 and {n_teacher} layers, not {k}")
    if not 0 <= shared < k:
        raise ModelError(f"a student of {k} layers can share 0 to {k - 1} of its teacher's, not {shared}")
    if how not in ("first", "spread"):
        raise ModelError(f"unknown layer choice '{how}' (first or spread)")
    rest, above = k - shared, n_teacher - shared
    if how == "first":
        tail = list(range(rest))
    elif rest == 1:
        tail = [above - 1]
    else:
        tail = sorted({round(i * (above - 1) / (rest - 1)) for i in range(rest)})
    return list(range(shared)) + [shared + i for i in tail]


def _encoder_layers(model: Any) -> Any:
    """The ModuleList of transformer layers (BERT/XLM-R style ``encoder.layer``)."""
    try:
        return model.encoder.layer
    except AttributeError:
        raise ModelError(f"cannot find the layers of a {type(model).__name__}; "
                         "students are supported for BERT-style encoders") from None


def make_student(teacher: Any, layers: list[int]) -> Any:
    """A new model with the teacher's embeddings (word table shared and frozen) and ``layers``."""
    import copy

    import torch

    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = len(layers)
    student = type(teacher)(config, add_pooling_layer=False) if _takes_pooler(teacher) else type(teacher)(config)
    state = teacher.state_dict()
    new_state = {}
    for key, value in state.items():
        if key.startswith("encoder.layer."):
            parts = key.split(".")
            src = int(parts[2])
            if src in layers:
                parts[2] = str(layers.index(src))
                new_state[".".join(parts)] = value.clone()
        elif not key.startswith("pooler."):
            new_state[key] = value.clone()
    missing, unexpected = student.load_state_dict(new_state, strict=False)
    if [m for m in missing if not m.startswith("pooler.")] or unexpected:
        raise ModelError(f"could not initialise the student: missing {missing}, unexpected {unexpected}")
    # share, do not copy, the vocabulary table
    student.get_input_embeddings().weight = teacher.get_input_embeddings().weight
    student.get_input_embeddings().weight.requires_grad_(False)
    student.train()
    torch.manual_seed(0)
    return student


def freeze_shared(student: Any, n: int) -> None:
    """Freeze the student's embeddings and first ``n`` layers (the teacher's own, unchanged by
    training), so that its hidden state after layer ``n`` is the teacher's."""
    for p in student.embeddings.parameters():
        p.requires_grad_(False)
    for layer in _encoder_layers(student)[:n]:
        for p in layer.parameters():
            p.requires_grad_(False)


def check_frozen(student: Any, teacher: Any, n: int) -> None:
    """Refuse to save a student whose shared weights moved in training: its folder leaves them
    out (they are read from the teacher at load), so a change would be lost unseen."""
    import torch

    mine, theirs = student.state_dict(), teacher.state_dict()
    for key in shared_keys(mine, n):
        if not torch.equal(mine[key], theirs[key]):
            raise ModelError(f"the student's shared weight {key} changed in training: not saved")


def prune_ffn(model: Any, width: int, batches: Iterable[dict[str, Any]]) -> None:
    """Keep ``width`` of each layer's feed-forward neurons, in place: those that add the most
    to the layer's output on ``batches`` (model inputs: ``input_ids``, ``attention_mask``).

    A neuron's contribution is its mean absolute activation over the real tokens times the
    norm of its column in the down-projection. The FFN is two thirds of a layer's multiplies
    at me5-small's shape (384 -> 1536 -> 384), so half the width is a third fewer FLOPs per
    query; the student is then trained as usual, from these neurons.
    """
    import torch

    layers = _encoder_layers(model)
    full = int(model.config.intermediate_size)
    if not 1 <= width <= full:
        raise ModelError(f"--ffn-width must be between 1 and the model's {full}, not {width}")
    sums = [torch.zeros(full) for _ in layers]  # summed over tokens: ranks as the mean does
    real: dict[str, Any] = {}  # the batch's real (not padding) tokens, for the hooks

    def record(i: int) -> Any:
        def hook(_module: Any, _inputs: Any, out: Any) -> None:
            sums[i] += (out.detach().abs() * real["mask"]).sum(dim=(0, 1))
        return hook

    hooks = [layer.intermediate.register_forward_hook(record(i)) for i, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            for batch in batches:
                real["mask"] = batch["attention_mask"].unsqueeze(-1).to(torch.float32)
                model(**batch)
    finally:
        for h in hooks:
            h.remove()
    for i, layer in enumerate(layers):
        up, down = layer.intermediate.dense, layer.output.dense
        importance = sums[i] * down.weight.detach().norm(dim=0)
        keep = torch.sort(torch.topk(importance, width).indices).values
        new_up = torch.nn.Linear(up.in_features, width, dtype=up.weight.dtype)
        new_down = torch.nn.Linear(width, down.out_features, dtype=down.weight.dtype)
        with torch.no_grad():
            new_up.weight.copy_(up.weight[keep])
            new_up.bias.copy_(up.bias[keep])
            new_down.weight.copy_(down.weight[:, keep])
            new_down.bias.copy_(down.bias)
        layer.intermediate.dense, layer.output.dense = new_up, new_down
    model.config.intermediate_size = width


def _takes_pooler(model: Any) -> bool:
    import inspect

    return "add_pooling_layer" in inspect.signature(type(model).__init__).parameters


def save_student(student: Any, folder: Path, meta: dict[str, Any],
                 projection: tuple[Any, Any, Any] | None = None) -> None:
    """Write the student folder atomically (temporary folder, then rename); ``projection`` is
    (mean, components, head) for a lower-dimension student."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
    try:
        state = {k: v.detach().contiguous() for k, v in student.state_dict().items()
                 if k != SHARED_KEY and not k.startswith("pooler.")}
        # a student sharing layers with its teacher holds only its own: the others are the
        # teacher's, read from it at load
        for key in shared_keys(state, int(meta.get("shared_layers") or 0)):
            del state[key]
        save_file(state, str(tmp / STUDENT_WEIGHTS), metadata={"format": "pt"})
        student.config.to_json_file(str(tmp / "config.json"))
        from vecplug.indexer.checksums import weights_sha256

        meta = {**meta, "weights_sha256": weights_sha256(tmp / STUDENT_WEIGHTS)}
        if projection is not None:
            save_projection(tmp, *projection)
            meta["projection_dim"] = int(projection[1].shape[1])
            meta["projection_sha256"] = weights_sha256(tmp / PROJECTION)
        (tmp / STUDENT_META).write_text(json.dumps(meta, indent=2, ensure_ascii=False))
        from vecplug.fsutil import make_readable, replace_folder

        make_readable(tmp)  # mkdtemp makes it private; a model folder is for everyone to read

        # never rmtree-then-rename: an interruption between the two would lose both students
        replace_folder(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_teacher_embeddings(teacher_path: Path) -> Any:
    """Only the word-embedding table of a teacher folder (no full model load when it is safetensors)."""
    import torch

    files = sorted(teacher_path.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    if key == SHARED_KEY or key.endswith("." + SHARED_KEY):
                        return fh.get_tensor(key).to(torch.float32)  # fp16 checkpoints too
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(teacher_path), trust_remote_code=False)
    return model.get_input_embeddings().weight.detach().clone().to(torch.float32)


def load_student(folder: Path, teacher_path: Path, teacher_checksum: str,
                 embeddings: Any = None) -> Any:
    """Load a student, its vocabulary table taken from the teacher at ``teacher_path``.

    ``embeddings`` (the teacher's table, already in memory) is shared instead of loaded again.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel

    meta = read_student_meta(folder)
    if meta.get("teacher_checksum") != teacher_checksum:
        raise ModelMismatchError(
            f"student {folder} was distilled from {meta.get('teacher')} "
            f"({meta.get('teacher_checksum')}), but the teacher found is {teacher_path} ({teacher_checksum})")
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    vocab = int(config.vocab_size)
    # built from the config as it is, the model would hold a randomly initialised table as big
    # as the teacher's (366 MiB for me5-small), only to drop it for the teacher's: the load's
    # peak memory. Built with the fewest rows the config allows (the padding id must exist),
    # and given its real size back once the teacher's table is in.
    config.vocab_size = int(getattr(config, "pad_token_id", None) or 0) + 1
    try:
        try:
            model = AutoModel.from_config(config, add_pooling_layer=False)
        except TypeError:
            model = AutoModel.from_config(config)
    finally:
        config.vocab_size = vocab
    small = model.get_input_embeddings()
    expected = (vocab, int(small.weight.shape[1]))
    state = load_file(str(folder / STUDENT_WEIGHTS))
    table = embeddings if embeddings is not None else load_teacher_embeddings(teacher_path)
    if tuple(table.shape) != expected:
        raise ModelMismatchError(f"the teacher's vocabulary table has shape {tuple(table.shape)}, "
                                 f"student {folder} expects {expected}")
    shared = int(meta.get("shared_layers") or 0)
    if shared:
        state = with_shared(state, shared_keys(model.state_dict(), shared), shared, teacher_path, folder)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if m != SHARED_KEY and not m.startswith("pooler.")] or unexpected:
        raise ModelError(f"{folder}: weights do not fit the config (missing {missing}, unexpected {unexpected})")
    small.weight = torch.nn.Parameter(table, requires_grad=False)
    small.num_embeddings = vocab
    return model.float().eval()  # a student of an fp16 teacher: float32, as the teacher loads


def shared_keys(state: Any, n: int) -> list[str]:
    """The keys (of a student's weights) that a student sharing ``n`` layers takes unchanged
    from its teacher: its embeddings but the vocabulary table, and its layers 0..n-1. Buffers
    the teacher's files do not hold (position ids) are left to the model."""
    if n <= 0:
        return []
    return [k for k in state if k != SHARED_KEY and not k.endswith("_ids") and (
        k.startswith("embeddings.") or (k.startswith("encoder.layer.") and int(k.split(".")[2]) < n))]


def with_shared(state: dict[str, Any], keys: list[str], n: int, teacher_path: Path,
                folder: Path) -> dict[str, Any]:
    """A shared-layer student's weights completed with the teacher's shared ones (``keys``):
    its folder holds none of them, as ``save_student`` writes it. One that holds some must
    hold the teacher's, or it is refused: the teacher reranker goes on from their state as if
    the teacher had computed it (``indexer.cascade``)."""
    import torch

    teacher = _teacher_tensors(teacher_path, keys, folder)
    for key, value in teacher.items():
        if key in state and not torch.equal(state[key].float(), value.float()):
            raise ModelMismatchError(
                f"student {folder} says its first {n} layers are its teacher's ({teacher_path}), "
                f"but its {key} is not the teacher's")
    return {**state, **teacher}


def _teacher_tensors(teacher_path: Path, keys: list[str], folder: Path) -> dict[str, Any]:
    """The teacher's tensors for a student's ``keys`` (the teacher's names may carry a prefix
    such as ``roberta.``), from its safetensors files without loading the model when it has
    them; a key the teacher lacks is an error naming the student."""
    files = sorted(Path(teacher_path).glob("*.safetensors"))
    wanted = set(keys)
    out: dict[str, Any] = {}

    def take(name: str) -> str | None:
        for key in wanted:
            if name == key or name.endswith("." + key):
                return key
        return None

    if files:
        from safetensors import safe_open

        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    key = take(name)
                    if key is not None:
                        out[key] = fh.get_tensor(name)
    else:
        from transformers import AutoModel

        state = AutoModel.from_pretrained(str(teacher_path), trust_remote_code=False).state_dict()
        out = {key: state[name] for name in state if (key := take(name)) is not None}
    if wanted - set(out):
        raise ModelMismatchError(f"student {folder} shares layers with its teacher {teacher_path}, which has "
                                 f"no {sorted(wanted - set(out))[0]}")
    return out


def make_head(mean: Any, components: Any) -> Any:
    """The student's projection head, initialised to the documents' PCA (trainable)."""
    import torch

    class Head(torch.nn.Module):
        """normalise -> subtract the teacher's mean -> (H x d) map + bias."""

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", mean.clone())
            self.weight = torch.nn.Parameter(components.clone())
            self.bias = torch.nn.Parameter(torch.zeros(components.shape[1]))

        def forward(self, pooled: Any) -> Any:
            return (torch.nn.functional.normalize(pooled, dim=-1) - self.mean) @ self.weight + self.bias

    return Head()


def pca(vectors: Any, dim: int) -> tuple[Any, Any]:
    """Mean and the top ``dim`` principal directions (H x dim) of unit vectors."""
    import torch

    mean = vectors.mean(0)
    _, _, vt = torch.linalg.svd(vectors - mean, full_matrices=False)
    return mean, vt[:dim].T.contiguous()


def save_projection(folder: Path, mean: Any, components: Any, head: Any) -> None:
    from safetensors.torch import save_file

    save_file({"mean": mean.contiguous(), "components": components.contiguous(),
               "head.weight": head.weight.detach().contiguous(), "head.bias": head.bias.detach().contiguous()},
              str(folder / PROJECTION))


def load_projection(folder: Path) -> dict[str, Any] | None:
    """The tensors of a student's projection, or None for a full-dimension student."""
    if not (folder / PROJECTION).is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(folder / PROJECTION))
