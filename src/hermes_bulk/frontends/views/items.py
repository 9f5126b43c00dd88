"""One item and the events of a job: `show`, `status --failed`, and the event lines `status` and
`show` list."""

from __future__ import annotations

from ...jobs.service import ItemShown, state_label
from ...store.protocol import Event, ItemRecord
from .times import clock


def event_lines(events: list[Event], names: dict[int, str] | None = None) -> list[str]:
    """One line per event, its item by name (as exports name it) where the name is known."""
    names = names or {}
    lines = []
    for e in events:
        where = (
            ""
            if e.item_index is None
            else f" {names.get(e.item_index) or f'item {e.item_index + 1}'}"
        )
        lines.append(f"{clock(e.at)} {_event_text(e, where)}")
    return lines


def _event_text(e: Event, where: str) -> str:
    """ "kind item HTTP n: message", or the message alone where it says the kind already
    ("resumed with --max-tokens 5000", not "resumed: resumed with …")."""
    message, http = _once(e.message), _http(e.http_status, e.message)
    if not where and not http and (message == e.kind or message.startswith(e.kind + " ")):
        return message
    return f"{e.kind}{where}{http}: {message}"


def _http(http_status: int | None, message: str) -> str:
    """' HTTP 503', unless the message already says it (each thing is said once)."""
    return f" HTTP {http_status}" if http_status and f"HTTP {http_status}" not in message else ""


def _once(message: str) -> str:
    """A message without the kind restated (events recorded before the kind carried it)."""
    return message.removeprefix("attempt failed: ")


def item_error(item: ItemRecord) -> str:
    status = (
        f" HTTP {item.http_status}"
        if item.http_status and f"HTTP {item.http_status}" not in (item.error_message or "")
        else ""
    )
    return f"{item.error_type or 'error'}{status}: {item.error_message or ''}".rstrip(": ")


def failed_text(job_id: str, failed: list[ItemRecord], total_failed: int, cmd: str) -> str:
    """`status --failed`: failed items by name with their recorded errors, capped."""
    if not failed:
        return f"Job {job_id} has no failed items."
    lines = [f"Failed items of job {job_id}:"] + [
        f"  {item.name}: {item_error(item)}" for item in failed
    ]
    if total_failed > len(failed):
        lines.append(
            f"  … and {total_failed - len(failed):,} more: {cmd} export {job_id} --only failed"
        )
    lines.append(f"One item in full: {cmd} show {job_id} ITEM")
    return "\n".join(lines)


def show_text(shown: ItemShown) -> str:
    """`show JOB ITEM`: state, tokens, the content as sent (framed), the answer, every attempt."""
    item = shown.detail.item
    lines = [
        f"Item {item.name} (number {item.index + 1} of job {shown.job.job_id})",
        f"State: {state_label(item.status)}",
        f"Tokens (reported by the provider): {item.tokens_in:,} in, {item.tokens_out:,} out",
    ]
    if item.model or item.provider:
        lines.append(f"Answered by: {' '.join(x for x in (item.model, item.provider) if x)}")
    if item.status == "failed":
        lines.append(f"Error: {item_error(item)}")
    lines += ["", "Sent:"] + [f"[{m['role']}]\n{m['content']}" for m in shown.messages]
    if shown.detail.content is None:
        lines.append(
            f"(not kept once the item completed: the file is {item.name} in "
            f"{shown.job.spec.source})"
        )
    lines += ["", "Answer:", item.result if item.result is not None else "(none yet)"]
    lines += ["", "Attempts and events:"]
    lines += ["  " + line for line in event_lines(shown.attempts, {item.index: item.name})] or [
        "  (none)"
    ]
    return "\n".join(lines)
