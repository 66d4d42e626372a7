"""What `blobsync doctor` finds about a URL: one finding per check, and the exit code they add up to."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from blobsync.errors import ExitCode


class Level(Enum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Finding:
    level: Level
    topic: str
    text: str
    auth: bool = False  # a failure of credentials or permissions (exit code 3) rather than of the service


@dataclass
class Diagnosis:
    """What `doctor` found: one finding per check, and per operation the permissions still missing."""

    url: str  # without its query string
    credential: str
    findings: list[Finding] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # operation -> what its SAS still lacks

    def add(self, level: Level, topic: str, text: str, *, auth: bool = False) -> None:
        self.findings.append(Finding(level, topic, text, auth))

    @property
    def exit_code(self) -> ExitCode:
        failures = [f for f in self.findings if f.level is Level.FAIL]
        if not failures:
            return ExitCode.OK
        return ExitCode.AUTH if any(f.auth for f in failures) else ExitCode.PARTIAL
