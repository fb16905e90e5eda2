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
  or `not_arrived` (a closed-loop step whose predecessor never finished or was rejected).
* `reject_reason` (null unless rejected): `queue_full` (the instance's waiting queue was at
  `cluster.max_waiting`), `prompt_too_long` (prompt >= `cluster.max_model_len`, refused
  before routing as vLLM's input processor does), `exceeds_kv_cache` (prompt + output
  needs more blocks than the instance's whole KV pool: it could never finish) or
  `resume_exceeds_kv_cache` (under `whole_prompt_watermark`, a request preempted after
  producing output whose prompt + outputs no longer fit in the pool beside the watermark;
  vLLM v0 marks it FINISHED_IGNORED when it next heads the waiting queue).
* With a changing fleet (lmsim.engine.fleet) only: status `failed` (lost to a crash and not
  sent again), reject reason `no_instance` (nothing routable), and the columns `retries`
  (times sent again) and `end_reason` (`END_REASONS`: the reject reason, or
  `instance_crash` / `retries_exhausted` for a failed request; null otherwise).
* With lower KV tiers (lmsim.engine.kv_tiers), for requests admitted on an instance that has
  them (null otherwise): `kv_hit_tokens_host` and `kv_hit_tokens_disk`, the tokens found in
  host memory and on disk beyond the GPU hit (`cached_tokens`) at the first admission, and
  `kv_load_bytes` and `kv_load_s`, the bytes every load of the request moved (the
  host-to-GPU copy, plus the disk read for disk blocks) and the seconds from each load's
  start to its landing (queueing on the lanes included), summed (0 when nothing was loaded).
* `output_tokens` is what the request generates: the trace's count, clipped to
  `max_model_len - input_tokens` (vLLM stops a request whose length reaches max_model_len).

Columns are numpy arrays indexed by request id (trace row), so recording is O(1) and no
per-request object outlives its request. Nothing here writes files.
"""

from __future__ import annotations

import numpy as np

from lmsim.engine.request import Request

NOT_ARRIVED, UNFINISHED, FINISHED, REJECTED = 0, 1, 2, 3
STATUS_NAMES = {NOT_ARRIVED: "not_arrived", UNFINISHED: "unfinished", FINISHED: "finished", REJECTED: "rejected"}
NO_REASON, QUEUE_FULL, PROMPT_TOO_LONG, EXCEEDS_KV_CACHE, RESUME_EXCEEDS_KV_CACHE = 0, 1, 2, 3, 4
REJECT_REASONS = {
    QUEUE_FULL: "queue_full",
    PROMPT_TOO_LONG: "prompt_too_long",
    EXCEEDS_KV_CACHE: "exceeds_kv_cache",
    RESUME_EXCEEDS_KV_CACHE: "resume_exceeds_kv_cache",
}
# Only runs with a changing fleet (lmsim.engine.fleet) have these, so the categories of every
# other run's columns stay as they were: a request that `failed` (its instance crashed under
# it), and the reasons a request of such a run ended other than finishing.
FAILED = 4
NO_INSTANCE, INSTANCE_CRASH, RETRIES_EXHAUSTED = 5, 6, 7
FLEET_STATUS_NAMES = {**STATUS_NAMES, FAILED: "failed"}
FLEET_REJECT_REASONS = {**REJECT_REASONS, NO_INSTANCE: "no_instance"}
END_REASONS = {**FLEET_REJECT_REASONS, INSTANCE_CRASH: "instance_crash", RETRIES_EXHAUSTED: "retries_exhausted"}


class Recorder:
    def __init__(self, num_requests: int, output_tokens: np.ndarray | None = None) -> None:
        n = num_requests
        self.output_tokens = (
            np.zeros(n, dtype=np.int64) if output_tokens is None else np.array(output_tokens, dtype=np.int64)
        )
        self.num_output_clipped = 0
        self.reject_reason = np.zeros(n, dtype=np.int8)
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
        self.handoffs: HandoffRecords | None = None  # disaggregated clusters only
        self.kv_tiers = False
        self.fleet = False

    def enable_handoffs(self) -> HandoffRecords:
        self.handoffs = HandoffRecords(len(self.status))
        return self.handoffs

    def track_kv_tiers(self) -> None:
        """Record the lower-tier columns too (some instance has host memory / disk tiers)."""
        n = len(self.status)
        self.kv_tiers = True
        self.kv_hit_tokens_host = np.full(n, -1, dtype=np.int64)
        self.kv_hit_tokens_disk = np.full(n, -1, dtype=np.int64)
        self.kv_load_bytes = np.full(n, -1, dtype=np.int64)
        self.kv_load_s = np.full(n, np.nan)

    def track_fleet(self) -> None:
        """Record the fleet columns too: resubmissions of each request (`retries`) and why it
        ended other than by finishing (`end_reason`, an `END_REASONS` code, 0: none)."""
        n = len(self.status)
        self.fleet = True
        self.retries = np.zeros(n, dtype=np.int64)
        self.end_reason = np.zeros(n, dtype=np.int8)

    def failed(self, request: Request, reason: int) -> None:
        self.store(request)
        self.status[request.request_id] = FAILED
        self.end_reason[request.request_id] = reason

    def arrived(self, request: Request) -> None:
        self.arrived_at[request.request_id] = request.arrived_at
        self.status[request.request_id] = UNFINISHED

    def rejected(self, request: Request, reason: int) -> None:
        self.store(request)
        self.status[request.request_id] = REJECTED
        self.reject_reason[request.request_id] = reason
        if self.fleet:
            self.end_reason[request.request_id] = reason

    def clipped(self, request: Request) -> None:
        self.output_tokens[request.request_id] = request.output_tokens
        self.num_output_clipped += 1

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
        if self.kv_tiers and request.kv_hit_tokens_host >= 0 and request.cached_tokens is not None:
            self.kv_hit_tokens_host[i] = request.kv_hit_tokens_host
            self.kv_hit_tokens_disk[i] = request.kv_hit_tokens_disk
            self.kv_load_bytes[i] = request.kv_load_bytes
            self.kv_load_s[i] = request.kv_load_s

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


class HandoffRecords:
    """Per request of a disaggregated cluster (columns only such runs have): where its
    prefill ran and how its KV reached the decode instance. A request prefilled on its decode
    instance (a bypass) keeps them null, and so does one whose prefill leg lost its KV to a
    preemption (lmsim.engine.disagg: no transfer). A decode instance otherwise always reads at
    least one block (vLLM's hit stops short of the prompt's last token), so every transfer
    moves bytes.

    * `prefill_instance_id`: the prefill instance; `instance_id` is the decode instance;
    * `prefill_done_at`: when the prefill instance computed the prompt (its own first token,
      never shown to the client);
    * `kv_transfer_start_at`: when the decode instance had allocated the blocks and the
      transfer began (after any wait for room there: the prefill instance holds the KV
      meanwhile); `kv_transfer_s`: first byte queued to last byte landed; `kv_transfer_bytes`.
    """

    def __init__(self, n: int) -> None:
        self.prefill_instance_id = np.full(n, -1, dtype=np.int64)
        self.prefill_done_at = np.full(n, np.nan)
        self.kv_transfer_start_at = np.full(n, np.nan)
        self.kv_transfer_s = np.full(n, np.nan)
        self.kv_transfer_bytes = np.full(n, -1, dtype=np.int64)
