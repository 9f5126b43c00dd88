"""An item's outcome saved: its answer (and the output file), a failure, an answer billed and
not kept; through a backend outage and a full disk, since an answer received is paid for."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import BackendUnavailable, ModelError, PermanentModelError
from ..files import write_private
from ..full_disk import disk_full_at
from ..jobs import bounds, prices
from ..providers.client import Completion
from ..store.protocol import Claim, ItemError
from .breaker import pause_job

log = logging.getLogger("hermes_bulk.runtime.pipeline")

#: Saving an outcome through a backend outage: the first wait, doubling up to the longest.
PERSIST_FIRST_WAIT_S, PERSIST_LONGEST_WAIT_S = 0.25, 5.0
#: Saving an answer onto a full disk: tried again this often until there is room (sooner than
#: a reaper's pass, should its lease have run out meanwhile).
ROOM_RETRY_S = 0.25


class LostClaim(Exception):
    """The item is no longer ours (its lease expired and it was given away)."""


def output_path(jobs_dir: Path, job_id: str, index: int) -> Path:
    return jobs_dir / job_id / "outputs" / f"{index:06d}.md"


class Saving:
    """An item's outcome saved (a part of ItemProcessor, pipeline.py, whose state it uses)."""

    def _output_file(self, job_id: str, index: int) -> str:
        """output_path as a string, its folder joined once per job (this runs for every item)."""
        folder = self._outputs.get(job_id)
        if folder is None:
            folder = self._outputs[job_id] = str(output_path(self.jobs_dir, job_id, 0).parent)
        return os.path.join(folder, f"{index:06d}.md")

    def _settle_billed(self, claim: Claim, exc: ModelError) -> None:
        """An answer the provider billed and that is not kept (truncated, invalid, refused):
        charged to the job in the store step that ends the claim (docs/decisions.md, "The
        job's cost is the provider's bill"). A permanent error fails the item; another counts
        an attempt and fails the item past its retries, else gives it back to pending, where
        the next attempt is reserved, and checked against the caps, by a claim of its own."""
        spec = claim.job.spec
        usage = prices.priced(claim.job, claim.content, exc.usage, by_batch=False)
        error = item_error(exc)
        if isinstance(exc, PermanentModelError):
            settled = self._persist(
                self.store.fail_item, spec.job_id, claim.index, self.worker_id, error, usage=usage
            )
            failed = settled
        else:
            attempts = self._persist(
                self.store.settle_failed_attempt,
                spec.job_id,
                claim.index,
                self.worker_id,
                error,
                retries=spec.retries,
                usage=usage,
            )
            settled, failed = attempts >= 0, attempts > spec.retries
        if not settled:
            raise LostClaim()
        if failed:
            self.counters.add(items_failed=1)

    def _save(
        self,
        claim: Claim,
        completion: Completion,
        chain: Callable[[], bool] | None,
        turn_key: str | None = None,
    ):
        """Complete the item; when the chain goes on, claim the next one in the same operation.

        A completion whose reply is lost and that is sent again (a backend outage, _persist) is
        refused the second time, and the item it claimed is then nobody's: its lease runs out
        and it goes back to the queue (at-least-once, as any claim whose reply is lost).
        turn_key: the provider key when its requests are unpaced: the next item's turn is then
        taken with its claim (complete_and_claim's take_turn; on Redis, a round trip less)."""
        spec = claim.job.spec
        usage = prices.priced(claim.job, claim.content, completion.usage, by_batch=False)
        args = (spec.job_id, claim.index, self.worker_id, completion.text, usage)
        names = {"provider": completion.provider, "model": completion.model}
        taken = None
        # A provider that bills above the bound: charged as reported, and no next item is
        # claimed with it (the caps no longer hold); the job pauses once this one is saved.
        beyond = bounds.beyond_bound(
            spec, claim.name, claim.content, claim.content_hash, completion.usage
        )
        if beyond is None and chain is not None and chain():
            done, taken = self._persist(
                self.store.complete_and_claim,
                *args,
                **names,
                index_hint=claim.index + 1,
                lease_s=self.lease_s,
                max_running=self.concurrency_cap,
                take_turn=turn_key,
            )
        else:
            done = self._persist(self.store.complete_item, *args, **names)
        if not done:
            raise LostClaim()
        if isinstance(taken, Claim):
            with self._held_lock:  # its lease is renewed from now on
                self._held.add((spec.job_id, taken.index))
        if beyond is not None:
            pause_job(self.store, spec.job_id, beyond)
        try:
            self.counters.add(
                items_completed=1,
                tokens_in=completion.usage.tokens_in or 0,
                tokens_out=completion.usage.tokens_out or 0,
            )
            self._until_room(
                write_private,
                self._output_file(spec.job_id, claim.index),
                completion.text + "\n",
            )
        except BaseException:
            if isinstance(taken, Claim):
                self.give_back(taken)
            raise
        return taken

    def _fail(self, claim: Claim, error: ItemError) -> None:
        if not self._persist(
            self.store.fail_item, claim.job.job_id, claim.index, self.worker_id, error
        ):
            raise LostClaim()
        self.counters.add(items_failed=1)

    def _persist(self, write, *args, **kwargs):
        """Save an outcome, waiting out a backend outage of up to a lease (0.25, 0.5, 1 … 5 s
        between tries; a plain loop: it runs for every item, so it must cost less than the
        write).

        The answer is already paid for: losing it to a Redis restart would send the item to the
        model again. Past a lease the item may have been handed to another worker anyway, and
        the store refuses a non-owner's write.
        """
        gives_up = time.monotonic() + self.lease_s
        pause = PERSIST_FIRST_WAIT_S
        while True:
            try:
                return self._until_room(write, *args, **kwargs)
            except BackendUnavailable:
                if time.monotonic() >= gives_up:
                    raise
                self.sleep(pause)
                pause = min(pause * 2, PERSIST_LONGEST_WAIT_S)

    def _until_room(self, write, *args, **kwargs):
        """write(*args), tried again while the disk it writes to is full: an answer received is
        never thrown away for want of space (it would be asked, and paid for, again). It waits
        in this thread, which takes no new item meanwhile; its lease is renewed with the other
        held items' where the store still takes so small a write. One that ran out anyway may be
        reaped before the next try once there is room: the save is then refused ("lease lost")
        and the item asked again."""
        told = False
        while True:
            try:
                result = write(*args, **kwargs)
            except Exception as exc:
                where = disk_full_at(exc, self.jobs_dir.parent)
                if where is None:
                    raise
                if not told:
                    told = True
                    log.warning(
                        "the disk is full at %s: an answer is kept in memory until it can be "
                        "saved (this thread takes no new item meanwhile); free some space there",
                        where,
                    )
                self.sleep(ROOM_RETRY_S)
                continue
            if told:
                log.info("there is room again: the answer kept in memory is saved")
            return result


def item_error(exc: ModelError) -> ItemError:
    # An attempt's event kind (attempt_failed) says it was an attempt: the message does not repeat
    # it.
    return ItemError(exc.error_type, str(exc), exc.http_status)
