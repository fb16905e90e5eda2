"""PolyServe: multi-SLO bins, pack onto the most loaded feasible instance (policies.md §8)."""

from __future__ import annotations

import math
from typing import Any

from lmsim.engine.request import Request
from lmsim.policies._common import check_number
from lmsim.policies.base import POLICIES, ClusterView, Policy, RouterContext
from lmsim.policies.predictive import estimate_ttft

DEFAULT_SLO_CLASSES: tuple[dict[str, float], ...] = ({"ttft_s": 2.0, "tpot_s": 0.1},)


@POLICIES.register("polyserve")
class PolyServe(Policy):
    """PolyServe re-implemented from its abstract (policies.md §8; no public code).

    SLO classes are bins: class k owns a contiguous share of the instances, tightest TPOT
    first (`bin_fractions`, equal shares by default; every bin gets at least one instance).
    The shares are of the instances the router lists (routable now, in id order), made
    again when their number changes, so every class keeps a bin while the fleet scales
    (lmsim's choice: the abstract does not say how bins follow a changing fleet).
    A request of class k goes to the feasible instance with the largest BS (R + Q) in its own
    bin, where feasible means `TTFT_hat ≤ ttft_s` and `TPOT_hat ≤ tpot_s`:
      * TTFT_hat: `estimate_ttft` (the llmd estimator) on the uncached tokens;
      * TPOT_hat: one decode step with every request on the instance plus this one decoding,
        `step_time((), BS + 1, total_tokens + input + BS + 1)`.
    If none is feasible, it borrows from tighter-SLO bins in order (the closest first), again
    packing onto the largest feasible BS. If still none, lmsim has no router queue, so the
    request goes to its own bin's instance with the lowest TTFT_hat (PolyServe would hold it).
    Ties on BS go to the lowest instance id, which keeps the load gradient deterministic.

    Params:
      slo_classes=[{ttft_s: 2.0, tpot_s: 0.1}]: list indexed by `request.slo_class`.
      default_slo_class=0: the class of requests whose trace has no SLO label (slo_class -1)
        or a label beyond the list.
      bin_fractions=None: per class (same order as slo_classes) share of the instances.
      estimator_profile=None: each instance's own profile and engine limits (a mixed
        fleet's pools differ), or another profile spec for every instance.
    """

    def __init__(
        self,
        *,
        slo_classes: list[dict[str, float]] | None = None,
        default_slo_class: int = 0,
        bin_fractions: list[float] | None = None,
        estimator_profile: str | dict | None = None,
    ) -> None:
        classes = list(slo_classes) if slo_classes is not None else list(DEFAULT_SLO_CLASSES)
        if not classes:
            raise ValueError("param 'slo_classes' must be a non-empty list, got []")
        self.slo: list[tuple[float, float]] = []
        for k, c in enumerate(classes):
            if not isinstance(c, dict) or set(c) != {"ttft_s", "tpot_s"}:
                raise ValueError(
                    f"param 'slo_classes' entries must be {{ttft_s, tpot_s}} mappings, "
                    f"got {c!r} at index {k}"
                )
            ttft = check_number(f"slo_classes[{k}].ttft_s", c["ttft_s"], lo=0, lo_open=True)
            tpot = check_number(f"slo_classes[{k}].tpot_s", c["tpot_s"], lo=0, lo_open=True)
            self.slo.append((float(ttft), float(tpot)))
        self.default_class = check_number(
            "default_slo_class", default_slo_class, lo=0, hi=len(self.slo) - 1, integer=True
        )
        if bin_fractions is not None:
            if not isinstance(bin_fractions, list) or len(bin_fractions) != len(self.slo):
                raise ValueError(
                    f"param 'bin_fractions' must be a list of {len(self.slo)} numbers > 0, "
                    f"got {bin_fractions!r}"
                )
            for k, f in enumerate(bin_fractions):
                check_number(f"bin_fractions[{k}]", f, lo=0, lo_open=True)
        self.bin_fractions = bin_fractions
        self.estimator_profile = estimator_profile
        self.bins: list[list[int]] = []  # positions in cluster.instances per class
        self._bins_n = 0  # the number of listed instances `bins` was made for

    def bind(self, ctx: RouterContext) -> None:
        super().bind(ctx)
        # None: each instance is priced with its own profile (a mixed fleet's pools differ)
        self.cost_model: Any = (
            None if self.estimator_profile is None else ctx.load_cost_model(self.estimator_profile)
        )
        self._bins_n = ctx.num_instances
        self.bins = self.make_bins(ctx.num_instances)

    def make_bins(self, n: int) -> list[list[int]]:
        """Positions among `n` listed instances per class: classes ordered by TPOT (tightest
        first) take consecutive instances; shares follow `bin_fractions`, at least one
        instance each (bins may share the last instance when there are more classes than
        instances)."""
        k = len(self.slo)
        fr = self.bin_fractions or [1.0] * k
        order = sorted(range(k), key=lambda c: (self.slo[c][1], c))
        total = sum(fr)
        bins: list[list[int]] = [[] for _ in range(k)]
        start = 0
        acc = 0.0
        for pos, c in enumerate(order):
            acc += fr[c]
            end = n if pos == k - 1 else max(start + 1, int(acc / total * n))
            end = min(end, n)
            lo = min(start, n - 1)
            bins[c] = list(range(lo, max(end, lo + 1)))
            start = end
        return bins

    def request_class(self, request: Request) -> int:
        c = request.slo_class
        return c if 0 <= c < len(self.slo) else self.default_class

    def choose(self, request: Request, cluster: ClusterView) -> int:
        if len(cluster.instances) != self._bins_n:
            self._bins_n = len(cluster.instances)
            self.bins = self.make_bins(self._bins_n)
        cls = self.request_class(request)
        cached = cluster.cached_prefix_tokens(request)
        inst = cluster.instances
        isl = request.input_tokens
        fixed = self.cost_model
        ttft_slo, tpot_slo = self.slo[cls]

        def ttft(i: int, give_up_above: float) -> float:
            v = inst[i]
            return estimate_ttft(
                v, isl - cached[i], cached[i], fixed or v.cost_model, v.max_num_batched_tokens,
                v.max_num_seqs, give_up_above=give_up_above,
            )

        def feasible(i: int) -> bool:
            v = inst[i]
            b = v.batch_size + 1
            tpot = (fixed or v.cost_model).step_time((), b, v.total_tokens + isl + b)
            # Only the verdict is needed: the replay stops once it passes the SLO.
            return tpot <= tpot_slo and ttft(i, ttft_slo) <= ttft_slo

        tighter = sorted(
            (c for c in range(len(self.slo)) if self.slo[c][1] < tpot_slo),
            key=lambda c: -self.slo[c][1],
        )
        for c in [cls, *tighter]:
            # The packing target is the feasible instance with the largest (BS, -id): trying
            # the bin in that order, the first feasible one is it, and the (costly) TTFT
            # replays of the instances after it are never needed.
            for i in sorted(self.bins[c], key=lambda i: (-inst[i].batch_size, i)):
                if feasible(i):
                    return i
        # None feasible: the lowest TTFT_hat, ties to the lowest id. A replay that passes the
        # best so far is cut short: its instance can be neither the minimum nor tied with it.
        best_i, best = -1, math.inf
        for i in self.bins[cls]:
            t = ttft(i, best)
            if t < best or best_i < 0:
                best_i, best = i, t
        return best_i
