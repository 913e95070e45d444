"""Helpers shared by the benchmark scripts: machine header, Markdown tables, JSON output."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import sys
from collections.abc import Callable, Sequence
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


def command_line() -> str:
    """The command exactly as typed (interpreter included)."""
    argv = getattr(sys, "orig_argv", None) or [Path(sys.executable).name, *sys.argv]
    return shlex.join(argv)


def machine_info() -> dict[str, Any]:
    """Machine, software versions, date (UTC) and command line of this run."""
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
        "command": command_line(),
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

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if a == "r" else "-" * w
                            for w, a in zip(widths, align)) + " |"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def percentile(values: Sequence[float], q: float) -> float:
    """The smallest observed value with at least ``q`` percent of the values at or below it
    (numpy's ``inverted_cdf``): always a real observation, so "p99 = 40 tokens" means 99% fit
    in 40."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="inverted_cdf"))


def fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def pct(x: float, digits: int = 1) -> str:
    return f"{100.0 * x:.{digits}f}%"


def save_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented UTF-8 JSON (creating folders) when ``path`` is given;
    through a temporary file, so an interrupted run never leaves half a file."""
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def run_main(parse_args: Callable[[Sequence[str] | None], Any], run: Callable[[Any], dict[str, Any]],
             render: Callable[[dict[str, Any]], str], argv: Sequence[str] | None = None) -> int:
    """The shared ``main`` of every benchmark: parse, run, print the tables, save the JSON."""
    args = parse_args(argv)
    results = run(args)
    print(render(results))
    save_json(args.json, results)
    return 0
