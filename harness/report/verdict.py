"""LoadGen's verdict as mlperf_log_summary.txt states it: the result, each check, the recommendations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SUMMARY_FILE = "mlperf_log_summary.txt"


@dataclass(frozen=True, slots=True)
class Verdict:
    result: str | None  # "VALID" | "INVALID"; None for an accuracy run (LoadGen states none)
    checks: tuple[tuple[str, str], ...]  # ("Min duration satisfied", "Yes"), ... in LoadGen's order
    recommendations: str  # LoadGen's own text ("" when it has none)

    @property
    def failed_checks(self) -> tuple[str, ...]:
        return tuple(name for name, value in self.checks if value.strip().lower() not in ("yes", "true"))


def read_verdict(log_dir: Path) -> Verdict | None:
    """None when the directory has no summary (LoadGen did not finish)."""
    path = Path(log_dir) / SUMMARY_FILE
    if not path.is_file():
        return None
    return parse_verdict(path.read_text())


def parse_verdict(text: str) -> Verdict:
    lines = text.splitlines()
    i = next((k for k, line in enumerate(lines) if line.startswith("Result is")), None)
    if i is None:
        return Verdict(None, (), "")
    result = lines[i].split(":", 1)[1].strip()
    checks: list[tuple[str, str]] = []
    j = i + 1
    while j < len(lines) and lines[j].startswith(" ") and ":" in lines[j]:
        name, value = lines[j].split(":", 1)
        checks.append((name.strip(), value.strip()))
        j += 1
    recommendations: list[str] = []
    if j < len(lines) and lines[j].startswith("Recommendations:"):
        j += 1
        while j < len(lines) and not lines[j].startswith("===="):
            recommendations.append(lines[j])
            j += 1
    return Verdict(result, tuple(checks), "\n".join(recommendations).strip())
