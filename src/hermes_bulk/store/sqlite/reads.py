"""Reading jobs and items on SQLite: one job, lists of jobs, items one by one or streamed,
failed items, names, the sample's candidates (the JobStore protocol, store/protocol.py; mixed
into SqliteJobStore). Nothing here writes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..compression import unpack
from ..protocol import CREATING, RUNNING, ItemDetail, ItemRecord, JobRecord, spread
from .rows import ITEM_COLUMNS, JOB_COLUMNS, item_record, job_from_row

#: Answer keys looked up per statement by `answered` (SQLite's limit on variables is 32,766).
ANSWERED_PAGE = 500


class SqliteReads:
    """The reads of SqliteJobStore (self.db comes from it)."""

    def get_job(self, job_id: str) -> JobRecord | None:
        rows = self.db.read(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND state != ?", (job_id, CREATING)
        )
        return job_from_row(rows[0]) if rows else None

    def find_job_ids(self, prefix: str) -> list[str]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self.db.read(
            "SELECT id FROM jobs WHERE id LIKE ? ESCAPE '\\' AND state != ? LIMIT 10",
            (escaped + "%", CREATING),
        )
        return [r[0] for r in rows]

    def list_jobs(self, limit: int = 20) -> list[JobRecord]:
        rows = self.db.read(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE state != ? ORDER BY created_at DESC LIMIT ?",
            (CREATING, limit),
        )
        return [job_from_row(r) for r in rows]

    def active_job_ids(self) -> list[str]:
        return [r[0] for r in self.db.read("SELECT id FROM jobs WHERE state = ?", (RUNNING,))]

    def answered(self, keys: list[str]) -> set[str]:
        found: set[str] = set()
        for low in range(0, len(keys), ANSWERED_PAGE):
            page = keys[low : low + ANSWERED_PAGE]
            marks = ", ".join("?" * len(page))
            found.update(
                r[0] for r in self.db.read(f"SELECT key FROM answers WHERE key IN ({marks})", page)
            )
        return found

    def iter_items(
        self, job_id: str, batch: int = 1000, *, with_content: bool = False
    ) -> Iterator[ItemRecord]:
        last = -1
        content, join = (
            (", c.text", " LEFT JOIN contents c ON c.job_id = i.job_id AND c.hash = i.content_hash")
            if with_content
            else ("", "")
        )
        while True:
            rows = self.db.read(
                f"SELECT {ITEM_COLUMNS}{content} FROM items i LEFT JOIN results r ON r.job_id "
                f"= i.job_id AND r.idx = i.idx{join} WHERE i.job_id = ? AND i.idx > ? ORDER BY "
                "i.idx LIMIT ?",
                (job_id, last, batch),
            )
            for r in rows:
                yield item_record(r)
            if len(rows) < batch:
                return
            last = rows[-1][0]

    def get_item(self, job_id: str, index: int) -> ItemDetail | None:
        rows = self.db.read(
            f"SELECT {ITEM_COLUMNS}, c.text, i.content_hash FROM items i LEFT JOIN results r ON "
            "r.job_id = i.job_id AND r.idx = i.idx LEFT JOIN contents c ON c.job_id = i.job_id AND "
            "c.hash = i.content_hash WHERE i.job_id = ? AND i.idx = ?",
            (job_id, index),
        )
        if not rows:
            return None
        *record, content, content_hash = rows[0]
        return ItemDetail(item_record(record), unpack(content), content_hash)

    def find_item(self, job_id: str, name: str) -> int | None:
        rows = self.db.read(
            "SELECT min(idx) FROM items WHERE job_id = ? AND name = ?", (job_id, name)
        )
        return rows[0][0] if rows else None

    def failed_items(self, job_id: str, limit: int) -> list[ItemRecord]:
        rows = self.db.read(
            f"SELECT {ITEM_COLUMNS} FROM items i INDEXED BY items_failed LEFT JOIN results r ON "
            "r.job_id = i.job_id AND r.idx = i.idx WHERE i.job_id = ? AND i.status = 'failed' "
            "ORDER BY i.idx LIMIT ?",
            (job_id, max(limit, 0)),
        )
        return [item_record(r) for r in rows]

    def item_names(self, job_id: str, indexes: Iterable[int]) -> dict[int, str]:
        wanted = sorted(set(indexes))
        if not wanted:
            return {}
        rows = self.db.read(
            "SELECT idx, name FROM items WHERE job_id = ? AND idx IN "
            f"({','.join('?' * len(wanted))})",
            (job_id, *wanted),
        )
        return dict(rows)

    def sample_pending(self, job_id: str, n: int) -> list[int]:
        pending = [
            row[0]
            for row in self.db.read(
                "SELECT idx FROM items WHERE job_id = ? AND status = 'pending' ORDER BY idx",
                (job_id,),
            )
        ]
        return [pending[rank] for rank in spread(len(pending), n)]

    def next_item_estimate(self, job_id: str) -> int | None:
        rows = self.db.read(
            "SELECT estimate FROM items WHERE job_id = ? AND status = 'pending'"
            " ORDER BY idx LIMIT 1",
            (job_id,),
        )
        return rows[0][0] if rows else None
