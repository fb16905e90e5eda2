"""Collection of per-request records and per-instance time series during a run.

Glossary (symbols as in Vidur's metrics doc): for a request r, a_r arrival, s_r first
scheduled, f_r first token, c_r finished, n_r output tokens.

* `ttft_s` = f_r - a_r; `tpot_s` = (c_r - f_r)/(n_r - 1), undefined (null) when n_r = 1;
  `e2e_s` = c_r - a_r; `queue_s` = s_r - a_r.
* `cached_tokens`: prefix-cache hit at the request's first admission.
* `lookup_tokens`, `lookup_hit_tokens`: tokens looked up in the prefix cache and hit, summed
  over every admission, first and resumed after preemption (a resumed lookup covers the
  prompt and the outputs so far).
* `status`: `finished`, `unfinished` (still in the system when the run stopped), `rejected`
  (waiting queue full) or `not_arrived` (a closed-loop step whose predecessor never finished).

Columns are numpy arrays indexed by request id (trace row), so recording is O(1) and no
per-request object outlives its request. Nothing here writes files.
"""

from __future__ import annotations

import numpy as np

from lmsim.engine.request import Request

NOT_ARRIVED, UNFINISHED, FINISHED, REJECTED = 0, 1, 2, 3
STATUS_NAMES = {NOT_ARRIVED: "not_arrived", UNFINISHED: "unfinished", FINISHED: "finished", REJECTED: "rejected"}


class Recorder:
    def __init__(self, num_requests: int) -> None:
        n = num_requests
        nan = np.full(n, np.nan)
        self.arrived_at = nan.copy()
        self.routed_at = nan.copy()
        self.first_scheduled_at = nan.copy()
        self.first_token_at = nan.copy()
        self.finished_at = nan.copy()
        self.predicted_ttft_s = nan.copy()
        self.instance_id = np.full(n, -1, dtype=np.int64)
        self.cached_tokens = np.full(n, -1, dtype=np.int64)
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.lookup_tokens = np.zeros(n, dtype=np.int64)
        self.lookup_hit_tokens = np.zeros(n, dtype=np.int64)
        self.status = np.zeros(n, dtype=np.int8)
        self.samples: list[tuple[float, int, int, int, int, float, int, int]] = []

    def arrived(self, request: Request) -> None:
        self.arrived_at[request.request_id] = request.arrived_at
        self.status[request.request_id] = UNFINISHED

    def rejected(self, request: Request) -> None:
        self.store(request)
        self.status[request.request_id] = REJECTED

    def finished(self, request: Request) -> None:
        self.store(request)
        self.status[request.request_id] = FINISHED

    def store(self, request: Request) -> None:
        i = request.request_id
        for name in ("routed_at", "first_scheduled_at", "first_token_at", "finished_at", "predicted_ttft_s"):
            value = getattr(request, name)
            if value is not None:
                getattr(self, name)[i] = value
        if request.instance_id is not None:
            self.instance_id[i] = request.instance_id
        if request.cached_tokens is not None:
            self.cached_tokens[i] = request.cached_tokens
        self.num_preemptions[i] = request.num_preemptions
        self.lookup_tokens[i] = request.lookup_tokens
        self.lookup_hit_tokens[i] = request.lookup_hit_tokens

    def sample(
        self,
        now: float,
        instance_id: int,
        num_running: int,
        num_waiting: int,
        num_prefilling: int,
        kv_usage: float,
        pending_prefill_tokens: int,
        total_tokens: int,
    ) -> None:
        self.samples.append(
            (now, instance_id, num_running, num_waiting, num_prefilling, kv_usage, pending_prefill_tokens, total_tokens)
        )
