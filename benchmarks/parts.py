"""Benchmarks whose parts run at different times (a simulation, a real-stack run) keep one JSON.

Each part replaces its own keys of `<stem>.json` and the Markdown and plots are rebuilt from the
whole file, so a part that failed can be rerun alone and the report always shows every part.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


OLDER_CODE = "made_with_older_code"  # a result's notes of the later changes it has not seen


def noted(markdown: str, result: dict) -> str:
    """The report with its result's older-code notes under the title. A real run is rerun only when
    the CPU time allows, so a result says which later changes of the code it predates."""
    notes = result.get(OLDER_CODE) or []
    if not notes:
        return markdown
    title, _, rest = markdown.partition("\n")
    return "\n".join([title, "", *(f"> Made with older code: {note}" for note in notes), rest])


def load(out: Path, stem: str) -> dict:
    path = out / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def write(out: Path, stem: str, result: dict, markdown: Callable[[dict], str],
          plot: Callable[[dict, Path], None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(noted(markdown(result), result))
    plot(result, out)


def update(out: Path, stem: str, markdown: Callable[[dict], str], plot: Callable[[dict, Path], None],
           **parts) -> dict:
    result = {**load(out, stem), **parts}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    write(out, stem, result, markdown, plot)
    return result
