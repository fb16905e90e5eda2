"""`run_plan`: the cheapest fleet that meets an SLO, over a design space, with the router as one
of the design's variables (issue 37). The search is described in lmsim.plan.search, the SLO and
its early stop in lmsim.plan.slo; this module runs the stages and assembles the answer."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmsim.config import ExperimentConfig
from lmsim.errors import ConfigError
from lmsim.plan.config import PlanSection, check_designs, load_plan
from lmsim.plan.design import Design, enumerate_designs
from lmsim.plan.probe import ProbeStore, probe_key
from lmsim.plan.search import CountSearch, Stage, drive, failure_text, objective_value, screen


@dataclass
class PlanResult:
    """What a plan found. `rows` has one entry per design (the table); `winner` is the label of
    the cheapest feasible design (None: nothing met the SLO within the budget), `tied` the
    labels that are within seed noise of it, `per_router` each router's cheapest feasible
    design, `screened` the evidence each screened-out design was dropped on, `infeasible` one
    line per failing constraint when nothing is feasible."""

    objective: str
    rows: list[dict[str, Any]]
    winner: str | None
    tied: list[str]
    per_router: dict[str, str | None]
    screened: dict[str, str]
    infeasible: list[str]
    notes: list[str]
    stats: dict[str, Any]
    out: Path | None = None
    winner_experiment: dict[str, Any] | None = None
    per_router_on_slice: dict[str, str] = field(default_factory=dict)  # routers with no full-length search
    stages: list[Stage] = field(default_factory=list, repr=False)

    def row(self, label: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["design"] == label)


def run_plan(
    plan_file: str | os.PathLike[str] | None = None,
    *,
    overrides: list[str] | None = None,
    base: ExperimentConfig | None = None,
    raw: dict[str, Any] | None = None,
    plan: PlanSection | None = None,
    out: str | os.PathLike[str] | None = None,
    workers: int = 1,
    dask: str | None = None,
    log: Callable[[str], None] | None = print,
) -> PlanResult:
    """Plan from a YAML file (`plan_file`) or from a loaded (`base`, `raw`, `plan`) triple.
    With `out`, every probe is saved there as it finishes (a rerun resumes from them) with the
    table, the Pareto figure and the winner's experiment YAML; without it nothing is written."""
    say = log or (lambda _line: None)
    if plan_file is not None:
        base, raw, plan = load_plan(plan_file, overrides)
        where = str(plan_file)
    else:
        if base is None or raw is None or plan is None:
            raise ConfigError("run_plan: give a plan file, or base, raw and plan")
        where = base.name
    assert base is not None and raw is not None and plan is not None
    if base.workload.load is not None:
        raise ConfigError(f"{where}: workload.load: a plan needs a stated rate (workload.rate, a rate_schedule "
                          "or the trace's own timing), not a fraction of one cluster's capacity")  # fmt: skip
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    folder = Path(out) if out is not None else None
    if folder is not None:
        from lmsim.study.rundir import check_output_dir, write_kind_marker

        check_output_dir(folder, "plan", resumable=True)
        folder.mkdir(parents=True, exist_ok=True)
        write_kind_marker(folder, "plan")
    started = time.perf_counter()
    designs, notes = enumerate_designs(plan)
    if not designs:
        raise ConfigError(f"{where}: plan: the design space is empty" + (f" ({notes[0]})" if notes else ""))
    check_designs(raw, designs, where)
    experiment_dir = base.source_dir or Path.cwd()
    from lmsim.plugins import loaded_plugins
    from lmsim.study.experiment import load_workload_trace, workload_identity

    full_length = len(load_workload_trace(base, experiment_dir))  # also warms the trace cache for forks
    # in every probe's key: a trace file edited in place is a new workload
    workload = workload_identity(base, experiment_dir)["source"]
    store = ProbeStore(folder)
    stop = {"drain_limit_s": plan.search.drain_limit_s, "check_interval_s": plan.search.check_interval_s,
            "early_stop": plan.search.early_stop}  # fmt: skip
    plugins = loaded_plugins()

    def make_task(design: Design, n: int, limit: int | None, seed: int, *, whole: bool = False) -> dict[str, Any]:
        stop_here = {**stop, "early_stop": False} if whole else stop
        exp = design.experiment(raw, n)
        exp["seed"] = seed
        if limit is not None:
            exp.setdefault("workload", {})["limit"] = limit
        exp.setdefault("output", {})["figures"] = False
        key = probe_key(exp, plan.slo, {**stop_here, "workload": workload})
        return {"key": key, "raw": exp, "slo": dict(plan.slo), "stop": stop_here,
                "where": f"{where} [{design.label} x{n}]", "experiment_dir": str(experiment_dir),
                "plugins": plugins}  # fmt: skip

    from lmsim.plan.executor import ProbeExecutor

    executor = ProbeExecutor(workers, dask)

    def execute(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results = []
        for result in executor.run(tasks):
            store.add(result)
            results.append(result)
        return results

    say(f"plan {base.name}: {len(designs)} designs ({len(plan.gpus)} GPUs x {len(plan.shapes)} shapes x "
        f"{len(plan.host_tier_gb)} host tiers x {len(plan.routers)} routers"
        + (f", {len(notes)} combinations skipped" if notes else "")
        + f"), {full_length} requests, objective {plan.objective}, budget {plan.budget_gpus} GPUs; "
        f"probes on {executor.where}" + (f"; {len(store.found)} saved probes to reuse" if store.found else ""))
    stages: list[Stage] = []
    screened: dict[str, str] = {}
    try:
        alive = list(designs)
        previous: dict[str, int | None] = {}
        for rung, length in enumerate(n for n in plan.search.screen_requests if n < full_length):
            stage = _stage(f"screening rung {rung + 1} (first {length} requests)", length, base.seed, alive,
                           plan, previous)  # fmt: skip
            drive(stage, make_task, store.get, execute, say)
            stages.append(stage)
            kept, dropped = screen(stage, plan.search.keep, plan.search.tie_margin, plan.objective)
            if not kept:  # nothing met the SLO on the slice: judge the full workload instead
                break
            screened.update(dropped)
            alive = [d for d in alive if d.label in kept]
            previous = {label: s.answer for label, s in stage.searches.items()}
        full = _stage("full runs", None, base.seed, alive, plan, previous)
        drive(full, make_task, store.get, execute, say)
        stages.append(full)
        if all(s.answer is None for s in full.searches.values()):
            _measure_at_budget(full, make_task, store.get, execute)
        seeded = _seeds(full, plan, base.seed, make_task, store.get, execute, say, stages)
    finally:
        executor.close()
    result = _assemble(designs, notes, plan, full, seeded, screened, stages, started, base)
    if result.winner is not None:
        winner = next(d for d in designs if d.label == result.winner)
        n = max(seeded[result.winner]) if result.winner in seeded else full.searches[result.winner].answer
        assert n is not None
        result.winner_experiment = winner_experiment(raw, base, winner, n, plan)
    if folder is not None:
        from lmsim.plan.output import write_outputs

        write_outputs(result, folder)
        result.out = folder.resolve()
    return result


def _stage(name: str, limit: int | None, seed: int, designs: list[Design], plan: PlanSection,
           previous: dict[str, int | None]) -> Stage:  # fmt: skip
    stage = Stage(name, limit, seed)
    for d in designs:
        cap = plan.budget_gpus // d.gpu.tp
        start = previous.get(d.label)
        stage.searches[d.label] = CountSearch(d, d.min_instances, cap, start or d.min_instances, informed=bool(start))
    return stage


def _measure_at_budget(full: Stage, make_task: Any, lookup: Any, execute: Any) -> None:
    """Nothing met the SLO: run every design once more at its budget without the early stop,
    so the report can say by how much each bound is missed (an early-stopped run only knows
    that it is)."""
    tasks = {}
    for label, search in full.searches.items():
        task = make_task(search.design, search.cap, full.limit, full.seed, whole=True)
        tasks[label] = task
    known = {label: lookup(t["key"]) for label, t in tasks.items()}
    ran = {r["key"]: r for r in execute([t for label, t in tasks.items() if known[label] is None])}
    for label, task in tasks.items():
        result = known[label] or ran[task["key"]]
        if not result["ok"]:
            raise ConfigError(f"{label} at the budget: {result['error']}")
        full.searches[label].at_budget = result


def _seeds(full: Stage, plan: PlanSection, base_seed: int, make_task: Any, lookup: Any, execute: Any,
           say: Callable[[str], None], stages: list[Stage]) -> dict[str, list[int]]:  # fmt: skip
    """Each finalist's answer under every seed of the plan (the full runs are the base seed)."""
    feasible = [s for s in full.searches.values() if s.answer is not None]
    feasible.sort(key=lambda s: (objective_value(s.design, s.answer, plan.objective), s.design.label))
    finalists = feasible[: plan.search.finalists]
    if finalists:  # a design costing the same as the last finalist is one too: ties are not cut by name
        last = objective_value(finalists[-1].design, finalists[-1].answer, plan.objective)
        finalists += [s for s in feasible[len(finalists):]
                      if objective_value(s.design, s.answer, plan.objective) <= last + 1e-9]  # fmt: skip
    answers: dict[str, list[int]] = {s.design.label: [] for s in finalists}
    for seed in plan.search.seeds:
        if seed == base_seed:
            for s in finalists:
                answers[s.design.label].append(s.answer)  # type: ignore[arg-type]
            continue
        stage = Stage(f"seed {seed}", None, seed)
        for s in finalists:
            assert s.answer is not None
            stage.searches[s.design.label] = CountSearch(s.design, s.low, s.cap, s.answer, informed=True)
        drive(stage, make_task, lookup, execute, say)
        stages.append(stage)
        for label, search in stage.searches.items():
            # a seed under which no count within the budget meets it: the budget is the answer's bound
            answers[label].append(search.answer if search.answer is not None else search.cap + 1)
    return answers


def _assemble(designs: list[Design], notes: list[str], plan: PlanSection, full: Stage,
              seeded: dict[str, list[int]], screened: dict[str, str], stages: list[Stage], started: float,
              base: ExperimentConfig) -> PlanResult:  # fmt: skip
    from lmsim.plan.slo import parse_bounds

    bounds = parse_bounds(plan.slo)
    rows = []
    for d in designs:
        row: dict[str, Any] = {"design": d.label, "gpu": d.gpu.label, "shape": d.shape, "host_gb": d.host_gb,
                               "router": d.router.name, "price_per_hour": d.gpu.price_per_hour}  # fmt: skip
        search = full.searches.get(d.label)
        if search is None:
            row.update(status="screened out", evidence=screened.get(d.label, ""))
            rows.append(row)
            continue
        n = search.answer
        if n is None:
            last = search.at_budget or (search.probes[max(search.probes)] if search.probes else {})
            row.update(status="infeasible", evidence=f"at {d.gpus(search.cap)} GPUs (budget): {failure_text(last)}",
                       closest=last)  # fmt: skip
            rows.append(row)
            continue
        probe = search.probes[n]
        counts = seeded.get(d.label, [n])
        lo, hi = min(counts), max(counts)
        tok_s = probe.get("offered_output_tok_s")
        cost = d.cost_per_hour(hi)
        row.update(
            status="feasible", instances=n, layout=d.describe(n), gpus=d.gpus(n),
            gpus_range=[d.gpus(lo), d.gpus(hi)], seeds=len(counts),
            cost_per_hour=d.cost_per_hour(n),
            cost_range=[d.cost_per_hour(lo), cost] if cost is not None else None,
            cost_per_m_tokens=(d.cost_per_hour(n) / (tok_s * 3600) * 1e6) if (tok_s and d.cost_per_hour(n)) else None,
            values={b.key: probe["values"].get(b.key) for b in bounds},
            margins={b.key: b.margin(probe["values"].get(b.key)) for b in bounds},
            early=probe.get("early"),
        )  # fmt: skip
        rows.append(row)

    def span(row: dict[str, Any]) -> tuple[float, float]:
        if plan.objective == "cost" and row.get("cost_range"):
            return tuple(row["cost_range"])  # type: ignore[return-value]
        return tuple(float(g) for g in row["gpus_range"])  # type: ignore[return-value]

    finalists = [r for r in rows if r["design"] in seeded]
    finalists.sort(key=lambda r: (sum(span(r)) / 2, span(r)[1], r["design"]))
    winner = finalists[0]["design"] if finalists else None
    tied = []
    if winner is not None:
        w_lo, w_hi = span(finalists[0])
        tied = [r["design"] for r in finalists[1:] if span(r)[0] <= w_hi + 1e-9 and w_lo <= span(r)[1] + 1e-9]
        for r in finalists:
            r["rank_note"] = ("cheapest" if r["design"] == winner else "tie (within seed noise)" if r["design"] in tied
                              else "finalist")  # fmt: skip
    per_router: dict[str, str | None] = {}
    on_slice: dict[str, str] = {}
    for router in plan.routers:
        feasible = [r for r in rows if r["router"] == router.name and r["status"] == "feasible"]
        feasible.sort(key=lambda r: (objective_value_row(r, plan.objective), r["design"]))
        per_router[router.name] = feasible[0]["design"] if feasible else None
        if not feasible:  # every design of this router was screened out: its best on the slice
            for stage in reversed([st for st in stages if st.name.startswith("screening")]):
                mine = [s for s in stage.searches.values() if s.design.router.name == router.name and s.answer]
                if mine:
                    best = min(mine, key=lambda s: (objective_value(s.design, s.answer, plan.objective), s.design.label))
                    assert best.answer is not None
                    on_slice[router.name] = (f"every design screened out; on the slice, {best.design.label} with "
                                             f"{best.design.gpus(best.answer)} GPUs ({stage.name})")  # fmt: skip
                    break
    infeasible = [] if winner is not None else _infeasible_lines(rows, bounds)
    full_searches = len(full.searches)
    full_probes = full.probes_run + full.probes_reused
    per_design = full_probes / full_searches if full_searches else 0.0
    stats = {
        "screening_calibration": _calibration(stages),
        "designs": len(designs),
        "skipped_combinations": len(notes),
        "screened_out": len(screened),
        "full_length_designs": full_searches,
        "full_length_probes": full_probes,
        "full_runs_saved_estimate": round(per_design * len(screened)),
        "stages": [{"name": s.name, "requests": s.limit, "seed": s.seed, "designs": len(s.searches),
                    "probes_run": s.probes_run, "probes_reused": s.probes_reused,
                    "probe_wall_s": round(s.wall_s, 2),
                    "answers": {label: search.answer for label, search in s.searches.items()}} for s in stages],
        "probes_run": sum(s.probes_run for s in stages),
        "probes_reused": sum(s.probes_reused for s in stages),
        "wall_s": round(time.perf_counter() - started, 2),
        "seed": base.seed,
    }
    return PlanResult(plan.objective, rows, winner, tied, per_router, screened, infeasible, notes, stats,
                      per_router_on_slice=on_slice, stages=stages)  # fmt: skip


def _calibration(stages: list[Stage]) -> dict[str, Any] | None:
    """How the last screening rung's counts compare with the full-length ones on the designs
    that went through both: the evidence of how far a short slice can be trusted (a workload
    that is not stationary over its first requests, such as conversations whose later turns
    carry longer contexts, needs more instances at full length)."""
    rungs = [s for s in stages if s.name.startswith("screening")]
    full = next((s for s in stages if s.name == "full runs"), None)
    if not rungs or full is None:
        return None
    ratios = sorted(
        full.searches[label].answer / rungs[-1].searches[label].answer  # type: ignore[operator]
        for label in full.searches
        if full.searches[label].answer and rungs[-1].searches.get(label) and rungs[-1].searches[label].answer
    )
    if not ratios:
        return None
    return {"rung": rungs[-1].name, "designs": len(ratios), "min": round(ratios[0], 3),
            "median": round(ratios[len(ratios) // 2], 3), "max": round(ratios[-1], 3)}  # fmt: skip


def objective_value_row(row: dict[str, Any], objective: str) -> float:
    if objective == "cost":
        return row.get("cost_per_hour") or math.inf
    return float(row.get("gpus") or math.inf)


def _infeasible_lines(rows: list[dict[str, Any]], bounds: list[Any]) -> list[str]:
    """Nothing met the SLO: per bound, the best any design reached at its budget, and by how
    much it misses."""
    lines = []
    for b in bounds:
        best = None
        for r in rows:
            judged = (r.get("closest") or {}).get("judged", {}).get(b.key)
            if judged is None or judged["value"] is None:
                continue
            value = judged["value"]
            score = -value if b.metric == "attainment" else value
            if best is None or score < best[0]:
                best = (score, value, r["design"], judged["met"])
        if best is None:
            continue
        _score, value, design, met = best
        if met:
            continue
        if b.metric == "attainment":
            lines.append(f"{b.key}: at best {value:.3f} < {b.limit:g} ({design}, at the GPU budget)")
        elif value >= 1e11:
            lines.append(f"{b.key}: every design leaves requests unfinished at the GPU budget (bound {b.limit:g} s)")
        else:
            lines.append(f"{b.key}: at best {value:.3g} s > {b.limit:g} s, {100 * (value / b.limit - 1):.0f}% over "
                         f"({design}, at the GPU budget)")  # fmt: skip
    return lines or ["no design met the SLO within the GPU budget (see the screened-out designs)"]


def winner_experiment(raw: dict[str, Any], base: ExperimentConfig, design: Design, n: int,
                      plan: PlanSection) -> dict[str, Any]:  # fmt: skip
    """The winning design as a runnable experiment: the base experiment at the count that met
    the SLO under every seed."""
    exp = {"name": f"{base.name}-plan", "description": "", **design.experiment(raw, n)}
    exp["name"] = f"{base.name}-plan"
    exp["description"] = (f"Cheapest design of `lmsim plan` ({plan.objective}): {design.label}, "
                          f"{design.describe(n)}, {design.gpus(n)} GPUs, meeting "
                          + ", ".join(f"{k} {v:g}" for k, v in sorted(plan.slo.items())))  # fmt: skip
    output = exp.get("output") or {}
    output.pop("dir", None)
    if not output:
        exp.pop("output", None)
    return exp
