"""ONE LoadGen SUT for Offline, Server and Interactive, on the shared asyncio loop.

LoadGen's issue callback only hands samples to the loop. Each sample becomes one task that
streams from the backend; completions are buffered and handed to LoadGen once per loop
iteration, from the loop thread only. The scenarios differ in one flag: Server/Interactive
report the first token (FirstTokenComplete) as soon as it arrives.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import Counter, deque
from collections.abc import Sequence

import mlperf_loadgen as lg

from harness.config import SamplingParams
from harness.dataset import Dataset
from harness.queries import QueryRecords

_EXAMPLES_PER_REASON = 5
_REASON_CHARS = 300


def failure_reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return reason[:_REASON_CHARS]


class _Query:
    """One outstanding query: what it has received so far, and the task that streams it."""

    __slots__ = ("idx", "sent_first", "t_first", "t_issued", "task", "tokens")

    def __init__(self, idx: int, t_issued: int) -> None:
        self.idx = idx
        self.t_issued = t_issued  # monotonic ns when LoadGen issued it
        self.t_first = 0  # monotonic ns of the first token; 0 until one comes
        self.tokens: list[int] = []
        self.sent_first = False
        self.task: asyncio.Task | None = None


class SUT:
    """Every issued query is completed exactly once: with the backend's full output, or, when the
    backend fails, times out or the run is interrupted, with the tokens received so far (never
    invented ones) and a counted failure reason.

    Whoever removes a query from `_queries` completes it: the streaming task when the stream ends,
    or a timeout / interrupt, which then cancels the task. So a backend that ignores cancellation
    cannot hold a query back, and a late task cannot complete it twice.
    """

    def __init__(
        self,
        backend,
        dataset: Dataset,
        params: Sequence[SamplingParams],
        *,
        first_token: bool,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float | None = None,
        records: bool = True,
    ) -> None:
        self._backend = backend
        self._prompts = dataset.prompts
        self._params = params
        self._first_token = first_token
        self._loop = loop
        self._timeout_s = timeout_s
        # (issue time in monotonic ns, [QuerySample]) batches from LoadGen threads, drained on the loop
        self._inbox: deque[tuple[int, list[lg.QuerySample]]] = deque()
        self._drain_pending = False
        self._queries: dict[int, _Query] = {}  # LoadGen query id -> outstanding query
        self._firsts: list[lg.QuerySampleResponse] = []
        self._dones: list[lg.QuerySampleResponse] = []
        self._keep: list[array] = []  # response buffers, alive until LoadGen has copied them
        self._flush_pending = False
        self.stopping = False
        # Counters, written on the loop thread only.
        self.issued = 0
        self.completed = 0
        self.output_tokens = 0
        self.failures: Counter[str] = Counter()
        self.failed_examples: dict[str, list[int]] = {}  # reason -> a few qsl indices
        # One tuple per completed query (queries.parquet); None when switched off (overhead bench).
        self.records: QueryRecords | None = QueryRecords() if records else None
        self.handle = lg.ConstructSUT(self._issue, self._flush_queries)

    def destroy(self) -> None:
        lg.DestroySUT(self.handle)

    @property
    def outstanding(self) -> int:
        return len(self._queries)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    # --- LoadGen threads -------------------------------------------------------------------

    def _issue(self, samples: list[lg.QuerySample]) -> None:
        self._inbox.append((time.monotonic_ns(), samples))
        # One wake-up per batch of issues, not per query. The loop clears the flag before it
        # drains, so a sample added after the drain's last pop always schedules a new drain.
        if not self._drain_pending:
            self._drain_pending = True
            self._loop.call_soon_threadsafe(self._drain)

    def _flush_queries(self) -> None:
        pass  # nothing is held back: every completion is flushed at the end of its loop iteration

    # --- loop thread -----------------------------------------------------------------------

    def _drain(self) -> None:
        self._drain_pending = False
        inbox, queries, create_task = self._inbox, self._queries, self._loop.create_task
        while inbox:
            t_issued, samples = inbox.popleft()
            for sample in samples:
                self.issued += 1
                q = _Query(sample.index, t_issued)
                if self.stopping:
                    self._complete(sample.id, q, "interrupted before it was sent")
                else:
                    queries[sample.id] = q
                    q.task = create_task(self._serve(sample.id, q))

    async def _serve(self, qid: int, q: _Query) -> None:
        reason: str | None = None
        timer = None
        if self._timeout_s is not None:
            timer = self._loop.call_later(self._timeout_s, self._expire, qid)
        try:
            async for chunk in self._backend.stream(self._prompts[q.idx].tolist(), self._params[q.idx]):
                if self._queries.get(qid) is not q:
                    return  # completed by a timeout or an interrupt; the backend ignored the cancel
                if not q.sent_first and chunk:
                    q.sent_first = True
                    q.t_first = time.monotonic_ns()
                    if self._first_token:
                        self._send_first(qid, chunk[0])
                q.tokens += chunk
        except asyncio.CancelledError:
            reason = "cancelled"
        except Exception as e:  # noqa: BLE001 - the one broad catch: record it, complete the query, go on
            reason = failure_reason(e)
        finally:
            if timer is not None:
                timer.cancel()
        if self._queries.pop(qid, None) is q:
            self._complete(qid, q, reason)

    def _expire(self, qid: int) -> None:
        q = self._queries.pop(qid, None)
        if q is not None:
            q.task.cancel()
            self._complete(qid, q, f"timeout: the query took longer than {self._timeout_s:g} s")

    def interrupt(self, reason: str = "interrupted") -> None:
        """Complete every outstanding query with what it has and cancel its stream; later
        queries are completed as soon as they arrive, without reaching the backend."""
        self.stopping = True
        queries, self._queries = self._queries, {}
        for qid, q in queries.items():
            q.task.cancel()
            self._complete(qid, q, reason)

    def _send_first(self, qid: int, token: int) -> None:
        buf = array("i", (token,))
        self._keep.append(buf)
        self._firsts.append(lg.QuerySampleResponse(qid, buf.buffer_info()[0], 4, 1))
        self._schedule_flush()

    def _complete(self, qid: int, q: _Query, reason: str | None) -> None:
        n = len(q.tokens)
        if n:
            try:
                buf = array("i", q.tokens)  # int32, the layout the accuracy log and evaluators expect
            except (TypeError, OverflowError) as e:
                reason = f"backend returned an invalid token id ({e})"
                n = 0
        if reason is not None:
            self.failures[reason] += 1
            examples = self.failed_examples.setdefault(reason, [])
            if len(examples) < _EXAMPLES_PER_REASON:
                examples.append(q.idx)
        if self._first_token and not q.sent_first:
            # LoadGen's Server bookkeeping needs a first-token record before the completion of
            # every sample; an empty one says "no token" without inventing one.
            self._firsts.append(lg.QuerySampleResponse(qid, 0, 0, 0))
        if n:
            self._keep.append(buf)
            self._dones.append(lg.QuerySampleResponse(qid, buf.buffer_info()[0], 4 * n, n))
        else:
            self._dones.append(lg.QuerySampleResponse(qid, 0, 0, 0))
        self.completed += 1
        self.output_tokens += n
        if self.records is not None:
            self.records.rows.append((q.idx, q.t_issued, q.t_first, time.monotonic_ns(), n, reason))
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        firsts, dones = self._firsts, self._dones
        self._firsts, self._dones, keep = [], [], self._keep
        self._keep = []
        # First tokens before completions: LoadGen must see a sample's first token first.
        if firsts:
            lg.FirstTokenComplete(firsts)
        if dones:
            lg.QuerySamplesComplete(dones)
        del keep  # LoadGen copied every buffer inside the calls above
