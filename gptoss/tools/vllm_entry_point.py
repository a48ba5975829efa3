"""Make the vLLM plugin's entry point visible to a source tree that was not pip-installed.

    python -m gptoss.tools.vllm_entry_point DIR    # then run with PYTHONPATH=DIR:.

vLLM finds general plugins through importlib.metadata entry points, which only an installed
distribution declares (`pip install -e .` writes pyproject.toml's). Where the project runs from its
folder instead (the GPU bench machine, a venv installed before the plugin existed), this writes a
minimal dist-info into DIR declaring the same entry point, read from pyproject.toml.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIST = "gptoss_vllm_plugin_dev"


def declared(group: str = "vllm.general_plugins") -> dict[str, str]:
    """pyproject.toml's entry points of `group`: name -> module:function."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project.get("entry-points", {}).get(group, {}))


def write_dist_info(folder: Path, group: str = "vllm.general_plugins") -> Path:
    points = declared(group)
    if not points:
        raise SystemExit(f"pyproject.toml declares no {group} entry point")
    info = Path(folder) / f"{DIST}-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.0.0\n")
    lines = [f"[{group}]", *(f"{name} = {target}" for name, target in points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return info


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    print(write_dist_info(Path(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
