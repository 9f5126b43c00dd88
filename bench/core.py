"""What every row shares: its result types, the run context, inputs, and small statistics."""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .procs import RedisProc


@dataclass
class Line:
    """One figure of a row, side by side with what it is compared with."""

    case: str  # "SQLite", "Redis, 2 workers x 64", …
    measured: str  # "512 items/s"
    reference: str  # "bare pool 1,290 items/s", "limit 60 s", "-"
    ratio: float | None  # measured / reference
    goal: str  # ">= 0.60", "<= 1.00", "" (reported, no goal)
    met: bool | None  # None: reported only


@dataclass
class RowResult:
    row: int
    title: str
    compared_with: str
    goal: str
    setup: str  # how it was measured: sizes, settings, what was timed
    lines: list[Line] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # markdown: per-round tables, notes
    raw: dict = field(default_factory=dict)
    quick: bool = False
    measured_at: str = ""
    elapsed_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average when the row started and ended

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RowResult:
        data = dict(data)
        data["lines"] = [Line(**line) for line in data.get("lines", [])]
        return cls(**data)


@dataclass
class Context:
    """What a row may use: sizes (quick or full), a temp dir of its own, the shared redis-server."""

    quick: bool
    tmp: Path
    rounds: int
    log: Callable[[str], None] = print
    _redis: RedisProc | None = None
    _prefixes: int = 0

    def dir(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def redis(self) -> RedisProc:
        if self._redis is None:
            self._redis = RedisProc(self.dir("redis"))
        return self._redis

    def redis_url(self) -> str:
        """A fresh key prefix on the shared redis-server: every run starts from empty keys."""
        self._prefixes += 1
        return self.redis.url(f"bench{self._prefixes}")

    def close(self) -> None:
        if self._redis is not None:
            self._redis.stop()
            self._redis = None


# Inputs -----------------------------------------------------------------------------------------

_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]
_CITIES = ("Lisbon", "Osaka", "Nairobi", "Quito", "Tromsø", "Adelaide", "Montréal", "Kraków")


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def write_jsonl(path: Path, n: int, seed: int = 1) -> Path:
    """n records of about 120 bytes: the items rows 1-3 and 6 process."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(
                json.dumps({"id": i, "title": _sentence(rng, 3), "text": _sentence(rng, 12)}) + "\n"
            )
    return path


def write_csv(path: Path, n: int, seed: int = 1) -> Path:
    """A CSV with a header and n rows of about 110 bytes (quoted cells, commas, non-ASCII)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("id,name,email,city,note\n")
        for i in range(n):
            name = f"{rng.choice(_WORDS).title()} {rng.choice(_WORDS).title()}"
            f.write(
                f'{i},{name},user{i}@example.com,{rng.choice(_CITIES)},"{_sentence(rng, 6)}, '
                f'{_sentence(rng, 3)}"\n'
            )
    return path


# Statistics and formatting ---------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("nan")


def fmt_rate(value: float, unit: str = "items/s") -> str:
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.1f} {unit}"


def fmt_s(value: float) -> str:
    return f"{value:,.2f} s" if value < 10 else f"{value:,.1f} s"


def at_least(ratio: float, goal: float) -> tuple[str, bool]:
    return f">= {goal:.2f}", ratio >= goal


def at_most(ratio: float, goal: float) -> tuple[str, bool]:
    return f"<= {goal:.2f}", ratio <= goal


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def now_text() -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z")
