"""Training checkpoints: one whole checkpoint survives a crash at any point of a save."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vecplug.indexer import checkpoint


def _model_and_optimizer(seed: int = 0):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _train(model, optimizer, steps: int) -> None:  # type: ignore[no-untyped-def]
    import torch

    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).pow(2).sum().backward()
        optimizer.step()


def test_a_save_interrupted_before_its_switch_leaves_the_previous_checkpoint_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the weights were replaced in place before state.json: a crash between them
    resumed step 1 with step 5's weights, and the run replayed steps on them."""
    import torch

    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 1)
    checkpoint.save(tmp_path, dict(model.named_parameters()), optimizer, {"key": "k", "step": 1})
    at_step_1 = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train(model, optimizer, 4)

    def crash(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("vecplug.fsutil.atomic_write_json", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, dict(model.named_parameters()), optimizer, {"key": "k", "step": 5})
    monkeypatch.undo()
    fresh, fresh_optimizer = _model_and_optimizer(seed=1)
    state = checkpoint.load(tmp_path, "k", dict(fresh.named_parameters()), fresh_optimizer)
    assert state is not None and state["step"] == 1
    for n, p in fresh.named_parameters():
        assert torch.equal(p, at_step_1[n])
        assert float(fresh_optimizer.state[p]["step"]) == 1.0
    # the next save switches, then clears the leftovers of both earlier ones
    checkpoint.save(tmp_path, dict(model.named_parameters()), optimizer, {"key": "k", "step": 6})
    files = json.loads((tmp_path / checkpoint.STATE).read_text())["files"]
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == sorted(files.values())


def test_a_damaged_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 1)
    checkpoint.save(tmp_path, dict(model.named_parameters()), optimizer, {"key": "k", "step": 1})
    files = json.loads((tmp_path / checkpoint.STATE).read_text())["files"]
    (tmp_path / files["weights"]).write_bytes(b"\x00" * 10)
    fresh, fresh_optimizer = _model_and_optimizer(seed=1)
    said: list[str] = []
    assert checkpoint.load(tmp_path, "k", dict(fresh.named_parameters()), fresh_optimizer, said.append) is None
    assert checkpoint.load(tmp_path, "another run", dict(fresh.named_parameters()), fresh_optimizer,
                           said.append) is None
    # starting over is said: the checkpoint is replaced at the run's first one
    assert "is damaged: starting over" in said[0] and "(step 1) is of another run" in said[1]
    assert checkpoint.load(tmp_path / "none", "k", dict(fresh.named_parameters()), fresh_optimizer,
                           said.append) is None and len(said) == 2  # no checkpoint: nothing to say


def test_a_checkpoint_of_the_earlier_layout_still_resumes(tmp_path: Path) -> None:
    """Fixed file names and a state without ``files``: what runs before this version wrote."""
    import torch

    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 2)
    checkpoint.save(tmp_path, dict(model.named_parameters()), optimizer, {"key": "k", "step": 2})
    state = json.loads((tmp_path / checkpoint.STATE).read_text())
    for kind, name in state.pop("files").items():
        (tmp_path / name).rename(tmp_path / {"weights": checkpoint.WEIGHTS, "optimizer": checkpoint.OPTIMIZER}[kind])
    (tmp_path / checkpoint.STATE).write_text(json.dumps(state))
    fresh, fresh_optimizer = _model_and_optimizer(seed=1)
    assert checkpoint.load(tmp_path, "k", dict(fresh.named_parameters()), fresh_optimizer)["step"] == 2
    for (_, a), (_, b) in zip(fresh.named_parameters(), model.named_parameters()):
        assert torch.equal(a, b)


def test_a_checkpoint_under_an_earlier_key_of_the_same_run_resumes(tmp_path: Path) -> None:
    """A run's key computed by an earlier vecplug's formula (given as ``earlier``) resumes its
    checkpoint; another run's key does not."""
    import torch

    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 2)
    checkpoint.save(tmp_path, dict(model.named_parameters()), optimizer, {"key": "old-formula", "step": 2})
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    fresh, fresh_opt = _model_and_optimizer(seed=1)
    said: list[str] = []
    assert checkpoint.load(tmp_path, "new-formula", dict(fresh.named_parameters()), fresh_opt, said.append) is None
    assert "is of another run" in said[-1]
    state = checkpoint.load(tmp_path, "new-formula", dict(fresh.named_parameters()), fresh_opt,
                            earlier=lambda: ("old-formula",))
    assert state is not None and state["step"] == 2
    assert all(torch.equal(p, saved[n]) for n, p in fresh.named_parameters())
