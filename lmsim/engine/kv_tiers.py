"""Host memory and local disk below each instance's GPU KV cache (issue 26): a KV connector
(lmsim.engine.connector) that keeps blocks the GPU computed and loads them back instead of
recomputing them.

What the engines do, and what this models (each source named where it is used):

* **Tiers.** Host memory (vLLM `OffloadingConnector`'s CPU tier, LMCache `local_cpu`, SGLang
  HiCache's host pool, Dynamo KVBM G2) and optionally a local disk below it (LMCache
  `local_disk`, KVBM G3). Each tier holds block hashes in LRU order with a capacity in blocks
  (`capacity_gb` / (block_size x the profile's `kv_bytes_per_token`)), a full tier evicting
  its least recently used (vLLM `LRUOffloadingManager`, the mocker's `HostTier` / `G3Tier`
  LRUs). Host memory keeps recency as vLLM's OffloadingConnector does: every lookup
  refreshes all of the request's blocks there, the ones the GPU hits too
  (`get_num_new_matched_tokens` touches the request's offload keys, first block most
  recent), so a prefix that always hits on the GPU does not age out below it; a store
  reserves its room when it starts (`prepare_store`: the new blocks take their places,
  unreadable until the copy lands, and only ready blocks no load is reading can be
  evicted) and is skipped whole when that room cannot be found, never cut. A tier of
  capacity 0 is no tier.
* **Stores.** `write_through` (default): every block the GPU cache registers is copied to
  host memory as it is computed, once per step (vLLM `_get_reqs_to_store` after each forward;
  LMCache per chunk after the forward; KVBM "a write-through cache"; the mocker's per-pass
  cohorts, `VllmHostOffloadAdapter::observe_completed_blocks`), skipping blocks host memory
  already has or is already receiving, the step's blocks as one store (vLLM prepares one
  per request; lmsim's GPU events do not name their request); with `store_scope: all` a
  request's GPU-hit blocks that host memory has lost are stored again with its first step
  (vLLM's `_get_reqs_to_store` starts at the request's first block). A block becomes
  readable in host memory when its copy completes, and that completion writes it on to disk (the mocker's G2 -> G3 on store completion, KVBM
  "G2->G3 triggered on registered host blocks"). `on_eviction`: a block is copied only when
  the GPU evicts it (SGLang `write_back`). `store_scope: prompt` stores only prompt blocks
  (LMCache `save_decode_cache: False`; the mocker offloads prompt blocks only); `all` stores
  generated blocks too (vLLM: `req.num_tokens` covers them).
* **Loads.** At admission, after the GPU hit, the connector offers the blocks that continue
  the prefix in host memory and then, after those, on disk (KVBM matches G2 then G3; Dynamo's
  router walks Device -> HostPinned -> Disk the same way, `query_lower_tiers`), up to the
  request's full blocks (vLLM's connector may cover every token; the scheduler then
  recomputes the last one). Host blocks cost one host-to-GPU copy; disk blocks are first
  read into host memory (promoted there, as the mocker's `VllmG3OffloadAdapter::stage`),
  then everything crosses to the GPU in one copy. `before_admission` (default): the request
  waits with its GPU blocks allocated while the others run and is admitted once the bytes
  have landed and the instance's connector poll has seen them (vLLM `WAITING_FOR_REMOTE_KVS`
  and `get_finished`, lmsim.engine.instance; the mocker delays admission by the load time);
  `in_step`: the load time is added to the step that admits it (LMCache's synchronous
  `start_load_kv` before the forward).
* **Copies** cross per-instance channels (lmsim.engine.links): a GPU-to-host lane and a
  host-to-GPU lane (PCIe is full duplex), a disk write and a disk read lane. `sharing`:
  `fifo` (default: one copy at a time per lane, in order; the mocker's private FIFO lanes),
  `fair` (equal shares of a lane) or `none` (each copy as if alone).

Defaults and why. write-through is what vLLM's OffloadingConnector, LMCache, SGLang's default
`write_through`, KVBM and the mocker all do; only SGLang's `write_back` waits for eviction.
Both measured on Coder under LMetric (experiments/beyond/tiers_store.yaml, after issue 34's
vLLM host recency; first-admission host hit ratio, write-through / on-eviction): 0.008 /
0.078 with 25 GB of host memory per instance (0.9x the GPU's KV, mean TTFT 18.43 / 16.39 s),
0.102 / 0.116 with 50 GB (15.78 / 15.82 s), 0.137 / 0.118 with 100 GB and more (14.34 /
15.85 s; one seed; write-through copies 24% more). A tier up to about twice the GPU's KV is
better used exclusively (on eviction it holds only what the GPU lost; write-through fills it
with copies of what the GPU still has, and the refresh at every lookup keeps the GPU's hot
prefixes there: before that refresh write-through measured 0.0195 and 0.114 at 25 and 50
GB); a larger one favours write-through, every block being below as soon as it is computed.
The tiers deployments use, hundreds of GB per instance, are in that regime, so the
measurement agrees with what the engines do. `before_admission` is
vLLM's and the mocker's; LMCache's synchronous load stalls the batch.
Default bandwidths (`TIER_DEFAULTS`): host 32e9 B/s each way, no first-byte latency (the
mocker's `native_host_offload` defaults, PCIe Gen4 x16 peak); disk 10e9 B/s and 0.1 ms (its
`g3_offload` defaults, a fast NVMe).

Time. The GPU cache's stored/evicted events reach the connector stamped with the end of the
step that produced them (`Instance.on_kv_event`), and under fast-forward possibly after that
time has passed. Stores are therefore planned from the stamps alone: events queue here, and
`catch_up(t)` applies them, the copies they start (`links.PlannedLane`) and the copies'
completions in time order up to t, before anything reads the tiers at t (an admission's
lookup, a router's view). Every event stamped t or earlier has arrived by then (an
instance's events arrive in stamp order, and a step's events before anyone reads the
instance after its start), so the tiers' state at t is the same whether steps were applied
one by one or in runs: results are identical with `simulation.fast_forward` on and off.
Loads start at admission, on the clock (`links.TransferNetwork`), and end with
`Instance.external_ready`.

Not modelled: the mocker's fence (a GPU block being copied out cannot be reused until the
copy completes) and SGLang write_back's wait for the copy before freeing a block: copies never
delay the GPU. A skipped store is not retried at the next step as vLLM's is (its blocks come
back only when a later request hits them on the GPU). Disk blocks being read stay readable
even if the disk tier evicts them meanwhile.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice, takewhile
from typing import TYPE_CHECKING, Any

from lmsim.config import KVTiersConfig, TierConfig
from lmsim.engine.clock import ARRIVAL, schedule_at
from lmsim.engine.links import Channel, PlannedLane, Transfer, TransferNetwork
from lmsim.errors import ConfigError
from lmsim.profile import kv_bytes_per_token as profile_kv_bytes_per_token

if TYPE_CHECKING:
    from lmsim.engine.instance import Instance
    from lmsim.engine.request import Request
    from lmsim.engine.scheduler import InstanceScheduler

TIER_DEFAULTS = {
    "host": {"read_bytes_s": 32e9, "write_bytes_s": 32e9, "latency_s": 0.0},
    "disk": {"read_bytes_s": 10e9, "write_bytes_s": 10e9, "latency_s": 1e-4},
}
# The medium a tier's KV events carry (vLLM's BlockStored/BlockRemoved `medium`, lower-cased
# as llm-d's index keeps it; Dynamo maps CPU to HostPinned and DISK to Disk).
MEDIUM = {"host": "cpu", "disk": "disk"}
INF = float("inf")
TierEventSink = Callable[[int, int, bool, float, str], None]  # (instance, hash, stored, at, medium)


@dataclass(frozen=True)
class TierSpec:
    """One tier with every field resolved."""

    name: str  # host | disk
    capacity_blocks: int
    read_bytes_s: float
    write_bytes_s: float
    latency_s: float


def resolve_tier(name: str, tier: TierConfig, block_bytes: int) -> TierSpec:
    defaults = TIER_DEFAULTS[name]
    if tier.capacity_blocks is not None:
        capacity = tier.capacity_blocks
    else:
        assert tier.capacity_gb is not None
        capacity = int(tier.capacity_gb * 1e9 // block_bytes)
    return TierSpec(
        name,
        capacity,
        tier.read_bytes_s if tier.read_bytes_s is not None else defaults["read_bytes_s"],
        tier.write_bytes_s if tier.write_bytes_s is not None else defaults["write_bytes_s"],
        tier.latency_s if tier.latency_s is not None else defaults["latency_s"],
    )


def kv_bytes_per_token(tiers: KVTiersConfig, cost_model: Any, where: str) -> int:
    """The tiers' own setting, else the profile's `model.kv_bytes_per_token`."""
    if tiers.kv_bytes_per_token is not None:
        return tiers.kv_bytes_per_token
    value = profile_kv_bytes_per_token(cost_model)
    if value is None:
        raise ConfigError(f"{where}.kv_bytes_per_token: required, the profile does not give KV bytes per token")
    return int(value)


class BlockStore:
    """One tier's blocks: hashes in LRU order (least recently used first), at most
    `capacity` of them, each ready, being stored (a copy on its way: it holds its place and
    cannot be read or evicted) or being read by loads (it cannot be evicted). vLLM's
    `LRUOffloadingManager` (vllm/v1/kv_offload/lru_manager.py): `ref_cnt` -1 while stored,
    > 0 while loaded, evictable at 0."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, int] = OrderedDict()  # hash -> -1 storing, 0 ready, n readers
        self.num_evictions = 0
        self.num_skipped = 0  # blocks whose store found no room (prepare_store)

    def __contains__(self, block_hash: int) -> bool:
        """Here or being stored here (a store of it would be filtered out)."""
        return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def leading(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """How many of hashes[start:stop] are here and ready, consecutively from `start`
        (`LRUOffloadingManager.lookup`)."""
        get = self._blocks.get
        return sum(1 for _ in takewhile(lambda h: get(h, -1) >= 0, islice(hashes, start, stop)))

    def touch(self, hashes: Iterable[int]) -> None:
        """Most recent, the first of `hashes` most of all (`LRUOffloadingManager.touch`
        walks them backwards, so a prefix outlives its tail)."""
        blocks = self._blocks
        move = blocks.move_to_end
        for h in reversed(list(hashes)):
            if h in blocks:
                move(h)

    def pin(self, hashes: Iterable[int]) -> None:
        """A load reads these ready blocks (`prepare_load`): they cannot be evicted."""
        blocks = self._blocks
        for h in hashes:
            blocks[h] += 1

    def unpin(self, hashes: Iterable[int]) -> None:
        """The load is done (`complete_load`)."""
        blocks = self._blocks
        for h in hashes:
            if h in blocks:
                blocks[h] -= 1

    def prepare_store(self, hashes: Sequence[int]) -> tuple[list[int], list[int]] | None:
        """Room for the hashes not here yet, as vLLM's `prepare_store`: evict least recent
        evictable blocks, or store nothing if too few are evictable (None); the new blocks
        take their places as most recent, being stored. Returns (to store, evicted)."""
        blocks = self._blocks
        fresh = [h for h in dict.fromkeys(hashes) if h not in blocks]
        excess = len(blocks) + len(fresh) - self.capacity
        evicted: list[int] = []
        if excess > 0:
            for h, refs in blocks.items():
                if refs == 0:
                    evicted.append(h)
                    if len(evicted) == excess:
                        break
            else:
                self.num_skipped += len(fresh)
                return None
            for h in evicted:
                del blocks[h]
            self.num_evictions += len(evicted)
        for h in fresh:
            blocks[h] = -1
        return fresh, evicted

    def complete_store(self, hashes: Iterable[int]) -> None:
        blocks = self._blocks
        for h in hashes:
            if blocks.get(h) == -1:
                blocks[h] = 0

    def insert(self, hashes: Iterable[int]) -> list[int]:
        """Add (or refresh) `hashes` as most recent and ready at once; returns the hashes
        evicted to make room, least recent first (a disk tier's stores; disk blocks promoted
        to host memory by a load)."""
        blocks = self._blocks
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = 0
        excess = len(blocks) - self.capacity
        if excess <= 0:
            return []
        # least recent first; a block being stored or read stays
        evicted = list(islice((h for h, refs in blocks.items() if refs == 0), excess))
        for h in evicted:
            del blocks[h]
        self.num_evictions += len(evicted)
        return evicted

    def order(self) -> list[int]:
        return list(self._blocks)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -INF
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


class TieredKV:
    """One instance's lower tiers and its KV connector (see the module docstring)."""

    def __init__(
        self,
        instance: Instance,
        config: KVTiersConfig,
        host: TierSpec,
        disk: TierSpec | None,
        block_bytes: int,
        publish: TierEventSink | None = None,
    ) -> None:
        self.instance = instance
        self.instance_id = instance.instance_id
        self.env = instance.env
        self.scheduler = instance.scheduler
        self.block_size = self.scheduler.block_size
        self.block_bytes = block_bytes
        self.host_spec, self.disk_spec = host, disk
        self.write_through = config.store == "write_through"
        self.prompt_only = config.store_scope == "prompt"
        self.in_step = config.load == "in_step"
        self.publish = publish
        self.host = BlockStore(host.capacity_blocks)
        self.disk = BlockStore(disk.capacity_blocks) if disk is not None else None
        name = f"instance {self.instance_id}"
        self.d2h = PlannedLane(Channel(f"{name} GPU->host", host.write_bytes_s), config.sharing, host.latency_s)
        self.disk_write = (
            PlannedLane(Channel(f"{name} host->disk", disk.write_bytes_s), config.sharing, disk.latency_s)
            if disk is not None else None
        )
        self.loads = TransferNetwork(self.env, config.sharing)
        self.h2d = Channel(f"{name} host->GPU", host.read_bytes_s)
        self.disk_read = Channel(f"{name} disk->host", disk.read_bytes_s) if disk is not None else None
        # GPU events not yet applied: (stamp, hash, stored, a generated block under
        # store_scope prompt), in arrival (= stamp) order
        self._incoming: deque[tuple[float, int, bool, bool]] = deque()
        self._to_disk: set[int] = set()  # copies to disk in flight
        # write_through: GPU-hit blocks of requests admitted in the plan being made that host
        # memory has lost, stored again with that plan's step (vLLM stores a request's blocks
        # from its first one, `_get_reqs_to_store`; `prepare_store` skips those it has)
        # (vLLM's store, so with store_scope all; the mocker and LMCache store what they compute)
        self.restores = self.write_through and not self.prompt_only
        self._restore: list[int] = []
        self._time = 0.0  # the tiers' state is as of this time
        # store_scope prompt: the generated-block hashes of requests on this instance (a
        # registration of one is an output block), and with on_eviction those now on the GPU
        self._live_outputs: Counter[int] = Counter()
        self._outputs_of: dict[int, list[int]] = {}
        self._gpu_outputs: set[int] = set()
        self._lookup: tuple[int, int, int, int] | None = None  # (request, first, host, disk)
        self._in_step_free = 0.0  # in_step: when this step's loads so far are done
        self._load_intervals: dict[str, list[tuple[float, float]]] = {"h2d": [], "disk_read": []}
        # totals for the summary
        self.hit_tokens = {"host": 0, "disk": 0}  # loaded, over every admission
        self.load_bytes = {"host": 0, "disk": 0}  # read from each tier
        self.h2d_bytes = 0
        self.num_loads = 0
        self.loading_ids: set[int] = set()  # requests whose lower-tier load is in flight

    # -- the GPU's events ----------------------------------------------------------------

    def on_gpu_event(self, block_hash: int, stored: bool, at: float) -> None:
        """The GPU cache stored or evicted `block_hash` in the step that ends at `at`.
        Whether a stored block is a generated one is decided now, while the request that
        generates it is still running (it finishes only after its blocks' events arrive)."""
        output = self.prompt_only and stored and block_hash in self._live_outputs
        self._incoming.append((at, block_hash, stored, output))

    def catch_up(self, now: float) -> None:
        """Apply every GPU event, copy start and copy completion due by `now`, in time order
        (at equal times: completions first, then the stores they allow)."""
        incoming = self._incoming
        d2h, dw = self.d2h, self.disk_write
        while True:
            t_in = incoming[0][0] if incoming else INF
            t_d2h = d2h.peek()
            t_dw = dw.peek() if dw is not None else INF
            t = min(t_in, t_d2h, t_dw)
            if t > now or t == INF:
                break
            self._time = max(self._time, t)
            if t_d2h == t:
                at, done = d2h.pop()
                for batch in done:
                    self._host_store_done(batch, at)  # type: ignore[arg-type]
            elif t_dw == t:
                assert dw is not None
                at, done = dw.pop()
                for batch in done:
                    self._disk_store_done(batch, at)  # type: ignore[arg-type]
            else:
                self._apply_events(t)
        self._time = max(self._time, now)

    def _apply_events(self, t: float) -> None:
        """The GPU events stamped t: the blocks to copy to host memory, one copy for them."""
        incoming = self._incoming
        batch: list[int] = []
        host = self.host
        while incoming and incoming[0][0] == t:
            _, h, stored, output = incoming.popleft()
            if stored:
                if output:
                    if not self.write_through:
                        self._gpu_outputs.add(h)
                    continue
                if not self.write_through:
                    continue
            else:
                if self.write_through:
                    continue
                if h in self._gpu_outputs:
                    self._gpu_outputs.discard(h)
                    continue
            if h in host:  # here or being stored here
                continue
            batch.append(h)
        if not batch:
            return
        # one store for the step's blocks, all or none (vLLM `prepare_store` per request:
        # lmsim's GPU events do not name their request)
        prepared = host.prepare_store(batch)
        if prepared is None:
            return
        fresh, evicted = prepared
        if evicted and self.publish is not None:
            for h in evicted:
                self.publish(self.instance_id, h, False, t, MEDIUM["host"])
        self.d2h.submit(t, len(fresh) * self.block_bytes, fresh)

    def _host_store_done(self, batch: list[int], at: float) -> None:
        self.host.complete_store(batch)
        if self.publish is not None:
            for h in batch:
                self.publish(self.instance_id, h, True, at, MEDIUM["host"])
        if self.disk is not None:
            assert self.disk_write is not None
            fresh = [h for h in batch if h not in self.disk and h not in self._to_disk]
            if fresh:
                self._to_disk.update(fresh)
                self.disk_write.submit(at, len(fresh) * self.block_bytes, fresh)

    def _disk_store_done(self, batch: list[int], at: float) -> None:
        self._to_disk.difference_update(batch)
        assert self.disk is not None
        self._insert(self.disk, "disk", batch, at)

    def _insert(self, store: BlockStore, name: str, hashes: list[int], at: float) -> None:
        publish = self.publish
        if publish is not None:
            fresh = [h for h in hashes if h not in store]
        evicted = store.insert(hashes)
        if publish is not None:
            medium, iid = MEDIUM[name], self.instance_id
            for h in fresh:
                publish(iid, h, True, at, medium)
            for h in evicted:
                publish(iid, h, False, at, medium)

    # -- lookups ------------------------------------------------------------------------

    def split(self, hashes: Sequence[int], gpu_blocks: int, stop: int) -> tuple[int, int]:
        """(host blocks, disk blocks) continuing a GPU hit of `gpu_blocks` in hashes[:stop]:
        the run in host memory, then the run on disk after it."""
        self.catch_up(self.env.now)
        host = self.host.leading(hashes, gpu_blocks, stop)
        disk = self.disk.leading(hashes, gpu_blocks + host, stop) if self.disk is not None else 0
        return host, disk

    def load_time_s(self, host_tokens: int, disk_tokens: int) -> float:
        """Seconds to bring these tokens to the GPU on idle lanes."""
        bpt = self.block_bytes / self.block_size
        t = 0.0
        if disk_tokens:
            assert self.disk_spec is not None
            t += self.disk_spec.latency_s + disk_tokens * bpt / self.disk_spec.read_bytes_s
        if host_tokens or disk_tokens:
            t += self.host_spec.latency_s + (host_tokens + disk_tokens) * bpt / self.host_spec.read_bytes_s
        return t

    # -- the connector ------------------------------------------------------------------

    def external_blocks(self, scheduler: InstanceScheduler, request: Request, local_hit_blocks: int) -> int:
        if self.prompt_only and request.request_id not in self._outputs_of:
            outputs = list(islice(request.kv_hashes, len(request.block_hashes), None))
            self._outputs_of[request.request_id] = outputs
            self._live_outputs.update(outputs)
        host = disk = 0
        if scheduler.enable_prefix_caching:
            stop = min(len(request.kv_hashes), request.num_tokens_target // self.block_size)
            host, disk = self.split(request.kv_hashes, local_hit_blocks, stop)
            # every lookup refreshes all of the request's blocks in host memory, the GPU hit's
            # too (OffloadingConnectorScheduler.get_num_new_matched_tokens touches the
            # request's offload keys): a prefix hot on the GPU does not age out below it
            self.host.touch(islice(request.kv_hashes, 0, stop))
        if request.first_scheduled_at is None:  # the lookup that admits it stays
            request.kv_hit_tokens_host = host * self.block_size
            request.kv_hit_tokens_disk = disk * self.block_size
        self._lookup = (request.request_id, local_hit_blocks, host, disk)
        return host + disk

    def start_load(self, scheduler: InstanceScheduler, request: Request, first_block: int, num_blocks: int) -> None:
        lookup = self._lookup
        assert lookup is not None and lookup[:2] == (request.request_id, first_block), "start_load without its lookup"
        _, _, host, disk = lookup
        assert host + disk == num_blocks
        hashes = request.kv_hashes
        loaded_host = list(islice(hashes, first_block, first_block + host))
        if self.disk is not None:
            self.disk.touch(islice(hashes, first_block + host, first_block + num_blocks))
        bs, bb = self.block_size, self.block_bytes
        self.hit_tokens["host"] += host * bs
        self.hit_tokens["disk"] += disk * bs
        self.load_bytes["host"] += host * bb
        self.load_bytes["disk"] += disk * bb
        self.h2d_bytes += num_blocks * bb
        self.num_loads += 1
        request.kv_load_bytes += num_blocks * bb + disk * bb
        promoted = list(islice(hashes, first_block + host, first_block + num_blocks))
        if self.in_step:
            self._load_in_step(scheduler, request, host, disk, promoted)
            return
        started = self.env.now
        self.loading_ids.add(request.request_id)
        self.host.pin(loaded_host)  # read by this load: not evicted meanwhile (prepare_load)

        def landed(transfer: Transfer) -> None:
            # Like a P/D transfer's landing (disagg `_landed`): after every step that ends
            # now, so a tie with a step end resolves alike with fast-forward on and off.
            schedule_at(self.env, self.env.now, ARRIVAL, lambda _e: ready(transfer))

        def ready(transfer: Transfer) -> None:
            self._load_intervals["h2d"].append((transfer.started_at, transfer.finished_at))
            request.kv_load_s += self.env.now - started
            self.loading_ids.discard(request.request_id)
            self.catch_up(self.env.now)
            self.host.unpin(loaded_host)
            self.instance.external_ready(request)

        def to_gpu() -> None:
            self.loads.submit(num_blocks * bb, (self.h2d,), latency_s=self.host_spec.latency_s, on_done=landed)

        if not disk:
            to_gpu()
            return

        def read(transfer: Transfer) -> None:
            self._load_intervals["disk_read"].append((transfer.started_at, transfer.finished_at))
            self._promote(promoted)
            to_gpu()

        assert self.disk_read is not None and self.disk_spec is not None
        self.loads.submit(disk * bb, (self.disk_read,), latency_s=self.disk_spec.latency_s, on_done=read)

    def _load_in_step(
        self, scheduler: InstanceScheduler, request: Request, host: int, disk: int, promoted: list[int]
    ) -> None:
        """LMCache's synchronous load: the step that admits the request waits for the bytes.
        Loads of one step follow each other on the idle lanes (no load is ever in flight
        between steps in this mode)."""
        bs, bb = self.block_size, self.block_bytes
        start = max(self.env.now, self._in_step_free)
        seconds = self.load_time_s(host * bs, disk * bs)
        end = self._in_step_free = start + seconds
        if disk:
            assert self.disk_spec is not None
            read = disk * bb / self.disk_spec.read_bytes_s
            after = start + self.disk_spec.latency_s + read
            self._load_intervals["disk_read"].append((after - read, after))
            self._promote(promoted)
        self._load_intervals["h2d"].append((end - (host + disk) * bb / self.host_spec.read_bytes_s, end))
        request.kv_load_s += seconds
        scheduler.step_extra_s += seconds
        scheduler.finish_load(request)

    def _promote(self, hashes: list[int]) -> None:
        """Disk blocks read for a load enter host memory on the way to the GPU."""
        if hashes:
            self.catch_up(self.env.now)
            self._insert(self.host, "host", [h for h in hashes if h not in self.host], self.env.now)

    def admitted(self, scheduler: InstanceScheduler, request: Request, hit_blocks: int) -> None:
        if self.restores and hit_blocks:
            self.catch_up(self.env.now)
            host = self.host
            self._restore.extend(h for h in islice(request.kv_hashes, 0, hit_blocks) if h not in host)

    def planned(self, published_at: float) -> None:
        """The instance planned a step whose KV events are published at `published_at`:
        the GPU-hit blocks to store again go with them."""
        restore, self._restore = self._restore, []
        for h in restore:
            self._incoming.append((published_at, h, True, False))

    def hold_on_finish(self, scheduler: InstanceScheduler, request: Request) -> bool:
        outputs = self._outputs_of.pop(request.request_id, None)
        if outputs:
            self._live_outputs.subtract(outputs)
            for h in outputs:
                if self._live_outputs[h] <= 0:
                    del self._live_outputs[h]
        return False

    # -- results ------------------------------------------------------------------------

    def totals(self) -> dict[str, float]:
        self.catch_up(INF)  # every store the run started, to its end
        out = {
            "hit_tokens_host": self.hit_tokens["host"],
            "hit_tokens_disk": self.hit_tokens["disk"],
            "load_bytes_host": self.load_bytes["host"],
            "load_bytes_disk": self.load_bytes["disk"],
            "h2d_bytes": self.h2d_bytes,
            "h2d_busy_s": _union_length(self._load_intervals["h2d"]),
            "d2h_bytes": self.d2h.bytes_moved,
            "d2h_busy_s": self.d2h.busy_s,
            "num_loads": self.num_loads,
            "host_evictions": self.host.num_evictions,
            "host_skipped": self.host.num_skipped,
        }
        if self.disk is not None:
            assert self.disk_write is not None
            out.update({
                "disk_read_busy_s": _union_length(self._load_intervals["disk_read"]),
                "disk_write_bytes": self.disk_write.bytes_moved,
                "disk_write_busy_s": self.disk_write.busy_s,
                "disk_evictions": self.disk.num_evictions,
            })
        return out


# -- building and summarizing -----------------------------------------------------------------


def build_kv_tiers(sim: Any) -> dict[int, TieredKV]:
    """Attach a `TieredKV` connector to every instance whose pool has lower tiers (of
    capacity > 0), subscribe it to its instance's KV events, and return them by instance id
    (empty when no pool has tiers: nothing is attached)."""
    from lmsim.engine.connector import attach_connector

    tiers: dict[int, TieredKV] = {}
    for pool in sim.pools:
        cfg = pool.kv_tiers
        if cfg is None or cfg.host is None:
            continue
        where = "cluster.kv_tiers" if sim.config.cluster.pools is None else f"cluster.pools.{pool.name}.kv_tiers"
        cost_model = sim.pool_cost_models[pool.name]
        block_bytes = sim.config.cluster.block_size * kv_bytes_per_token(cfg, cost_model, where)
        host = resolve_tier("host", cfg.host, block_bytes)
        disk = resolve_tier("disk", cfg.disk, block_bytes) if cfg.disk is not None else None
        if host.capacity_blocks == 0:
            continue
        if disk is not None and disk.capacity_blocks == 0:
            disk = None
        for i in pool.instance_ids:
            instance = sim.instances[i]
            tier = TieredKV(instance, cfg, host, disk, block_bytes)
            attach_connector(instance.scheduler, tier)
            if tier.restores:
                instance.on_planned = tier.planned
            tiers[i] = tier
    if tiers:
        def route(instance_id: int, block_hash: int, stored: bool, at: float) -> None:
            tier = tiers.get(instance_id)
            if tier is not None:
                tier.on_gpu_event(block_hash, stored, at)

        sim.subscribe_kv_events(route)
    return tiers


def tier_summary(sim: Any, requests: Any) -> dict[str, Any]:
    """The summary's tier fields: per-tier hit ratios (first admission, from the request
    records; and over every lookup, resumed requests included, as `prefix_hit_ratio`), bytes
    loaded and stored and the busy time of each lane, summed over instances."""
    totals: Counter[str] = Counter()
    for tier in sim.kv_tiers.values():
        totals.update(tier.totals())
    looked = float(requests["lookup_tokens"].to_numpy().sum())
    out: dict[str, Any] = {
        "kv_tiers_instances": len(sim.kv_tiers),
        "prefix_hit_ratio_host": totals["hit_tokens_host"] / looked if looked else 0.0,
        "prefix_hit_ratio_disk": totals["hit_tokens_disk"] / looked if looked else 0.0,
        "kv_num_loads": int(totals["num_loads"]),
        "kv_load_bytes_host": int(totals["load_bytes_host"]),
        "kv_load_bytes_disk": int(totals["load_bytes_disk"]),
        "kv_h2d_bytes": int(totals["h2d_bytes"]),
        "kv_h2d_busy_s": float(totals["h2d_busy_s"]),
        "kv_offload_bytes_host": int(totals["d2h_bytes"]),
        "kv_d2h_busy_s": float(totals["d2h_busy_s"]),
        "kv_host_evictions": int(totals["host_evictions"]),
    }
    has_disk = any(t.disk is not None for t in sim.kv_tiers.values())
    out.update({
        "kv_disk_read_busy_s": float(totals["disk_read_busy_s"]) if has_disk else None,
        "kv_offload_bytes_disk": int(totals["disk_write_bytes"]) if has_disk else None,
        "kv_disk_write_busy_s": float(totals["disk_write_busy_s"]) if has_disk else None,
        "kv_disk_evictions": int(totals["disk_evictions"]) if has_disk else None,
    })
    return out
