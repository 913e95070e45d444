"""Report helpers shared by ``vecplug eval`` and the benchmarks: the machine header, Markdown
tables, number formatting.

Every figure vecplug reports says on what machine, when and by which command it was made;
this module is the one place that header is written. It imports nothing heavy at module
level (torch is imported by :func:`machine_info` only, for its version and thread count).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: environment settings that change what a run measures, shown before its command when set
#: (oneDNN's instruction-set limit makes a CPU with AMX behave like an older one)
MEASURED_ENV = ("ONEDNN_MAX_CPU_ISA",)


def command_line() -> str:
    """The command exactly as typed (interpreter included), after the :data:`MEASURED_ENV`
    settings it ran with."""
    argv = getattr(sys, "orig_argv", None) or [Path(sys.executable).name, *sys.argv]
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in MEASURED_ENV if os.environ.get(k)]
    return " ".join([*env, shlex.join(argv)])


def machine_info(command: str | None = None) -> dict[str, Any]:
    """Machine, software versions, date (UTC) and command line of this run.

    ``command`` replaces the process's own command line (e.g. when a command runs inside
    another program, such as a test runner).
    """
    import torch

    from vecplug import __version__

    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vecplug": __version__,
        "vecplug_home": os.environ.get("VECPLUG_HOME", ""),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "command": command if command is not None else command_line(),
        "cwd": os.getcwd(),
    }


def header_markdown(title: str, info: dict[str, Any]) -> str:
    """A Markdown heading plus the run's machine, date and command."""
    lines = [
        f"## {title}",
        "",
        f"- date (UTC): {info['date_utc']}",
        f"- machine: {info['platform']}; CPU {info['cpu']}; {info['cores']} cores (os.cpu_count); "
        f"torch threads {info['torch_threads']}; load average at start {info['load_average']}",
        f"- software: Python {info['python']}, torch {info['torch']}, vecplug {info['vecplug']}",
        f"- command: `{info['command']}` (in `{info['cwd']}`)",
    ]
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: str | None = None) -> str:
    """A GitHub Markdown table; ``align`` is one letter per column (``l``/``r``), default
    left for the first column and right for the rest."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                 for c, w, a in zip(row, widths, align)) + " |"

    # at least one dash a cell: GitHub does not read ":" alone as a separator (a 1-wide column)
    sep = "| " + " | ".join(("-" * max(w - 1, 1) + ":") if a == "r" else "-" * w
                            for w, a in zip(widths, align)) + " |"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def percentile(values: Sequence[float], q: float) -> float:
    """The smallest observed value with at least ``q`` percent of the values at or below it
    (numpy's ``inverted_cdf``): always a real observation, so "p99 = 40 tokens" means 99% fit
    in 40."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="inverted_cdf"))


def fmt(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals; ``-`` for a missing value."""
    return "-" if x is None else f"{x:.{digits}f}"


def pct(x: float | None, digits: int = 1) -> str:
    """``x`` as a percentage; ``-`` for a missing value."""
    return "-" if x is None else f"{100.0 * x:.{digits}f}%"
