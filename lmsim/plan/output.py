"""What a plan writes: the table (`plan.txt`, printed too), everything as data (`plan.json`),
the Pareto front of cost against the tightest SLO metric (`pareto.png`), and the winning design
as a runnable experiment (`winner.yaml`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from lmsim.outputs import write_text

PLAN_JSON = "plan.json"
PLAN_TABLE = "plan.txt"
PARETO_FIGURE = "pareto.png"
WINNER_YAML = "winner.yaml"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return "unfinished" if value >= 1e11 else f"{1000 * value:.0f}ms"


def format_table(result: Any) -> str:
    """The table a person acts on, then the verdict lines."""
    keys = sorted({k for r in result.rows for k in r.get("values", {})})
    header = ["design", "GPUs", "$/h", "$/M tok", *keys, "status"]
    lines = []
    order = {"feasible": 0, "infeasible": 1, "screened out": 2}
    rank = {"cheapest": 0, "tie (within seed noise)": 1, "finalist": 2}
    rows = sorted(result.rows, key=lambda r: (order[r["status"]], rank.get(r.get("rank_note", ""), 3),
                                              r.get("cost_per_hour") or math.inf, r.get("gpus") or math.inf,
                                              r["design"]))  # fmt: skip
    body = []
    for r in rows:
        if r["status"] != "feasible":
            body.append([r["design"], "-", "-", "-", *["-"] * len(keys), f"{r['status']}: {r.get('evidence', '')}"])
            continue
        lo, hi = r["gpus_range"]
        gpus = f"{r['gpus']}" + (f" [{lo}-{hi}]" if (lo, hi) != (r["gpus"], r["gpus"]) or r["seeds"] > 1 else "")
        cost = "-" if r["cost_per_hour"] is None else f"{r['cost_per_hour']:.2f}"
        per_m = "-" if r["cost_per_m_tokens"] is None else f"{r['cost_per_m_tokens']:.3f}"
        cells = []
        for k in keys:
            value, margin = r["values"].get(k), r["margins"].get(k)
            shown = f"{value:.3f}" if k == "attainment" and value is not None else _ms(value)
            cells.append(shown + ("" if margin is None else f" ({100 * margin:+.0f}%)"))
        status = r.get("rank_note", "feasible") + f" ({r['layout']})"
        body.append([r["design"], gpus, cost, per_m, *cells, status])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    widths[-1] = 0  # the status runs to the end of the line
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for row in body:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    lines.append("")
    lines.extend(verdict_lines(result))
    return "\n".join(lines)


def verdict_lines(result: Any) -> list[str]:
    s = result.stats
    out = []
    if result.winner is not None:
        w = result.row(result.winner)
        seeds = f" over {w['seeds']} seeds" if w["seeds"] > 1 else ""
        lo, hi = w["gpus_range"]
        count = f"{lo}-{hi}" if lo != hi else f"{lo}"
        cost = "" if w["cost_per_hour"] is None else f", ${w['cost_per_hour']:.2f}/h"
        out.append(f"cheapest: {result.winner}: {count} GPUs{seeds}{cost} ({w['layout']})")
        if result.tied:
            out.append(f"tie: within seed noise of the cheapest: {', '.join(result.tied)} (not ranked)")
    else:
        out.append("infeasible: no design meets the SLO within the GPU budget")
        out.extend(f"  {line}" for line in result.infeasible)
    for router, label in result.per_router.items():
        if label is None:
            label = result.per_router_on_slice.get(router, "none feasible within the budget")
        out.append(f"cheapest with {router}: {label}")
    out.append(
        f"search: {s['designs']} designs, {s['screened_out']} screened out on short slices, "
        f"{s['full_length_designs']} searched at full length ({s['full_length_probes']} full-length probes; "
        f"about {s['full_runs_saved_estimate']} full-length probes saved by the screening); "
        f"{s['probes_run']} probes run, {s['probes_reused']} reused; {s['wall_s']:.0f} s"
    )
    cal = s.get("screening_calibration")
    if cal:
        out.append(
            f"screening check: on the {cal['designs']} designs searched at both lengths, the full workload needed "
            f"{cal['min']:g}-{cal['max']:g}x the instances of {cal['rung']} (median {cal['median']:g}x); "
            "designs were screened on their cost relative to each other on the slice"
        )
    return out


def pareto_points(result: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """Every full-length probe as (cost, tightest metric) and the bound plotted: the one with the
    least margin at the cheapest design (else the first)."""
    full = next((st for st in result.stages if st.name == "full runs"), None)
    if full is None:
        return None, []
    winner = result.row(result.winner) if result.winner else None
    keys = sorted({k for r in result.rows for k in r.get("values", {})})
    key = None
    if winner is not None and winner.get("margins"):
        key = min((k for k in keys if winner["margins"].get(k) is not None), key=lambda k: winner["margins"][k],
                  default=None)  # fmt: skip
    if key is None:
        key = next(iter(sorted({k for st in result.stages for s in st.searches.values()
                                for p in s.probes.values() for k in p.get("values", {})})), None)  # fmt: skip
    points = []
    for label, search in full.searches.items():
        d = search.design
        for n, probe in sorted(search.probes.items()):
            value = probe.get("values", {}).get(key)
            if value is None or value >= 1e11:
                continue
            points.append({"design": label, "router": d.router.name, "gpu": d.gpu.label, "shape": d.shape,
                           "instances": n,
                           "gpus": d.gpus(n), "cost_per_hour": d.cost_per_hour(n), "value": value,
                           "met": probe["met"]})  # fmt: skip
    return key, points


def front(points: list[dict[str, Any]], x: str) -> list[dict[str, Any]]:
    """The points no other point beats on both cost (x) and the metric (lower is better)."""
    out, best = [], math.inf
    for p in sorted(points, key=lambda p: (p[x], p["value"])):
        if p["value"] < best:
            out.append(p)
            best = p["value"]
    return out


def draw_pareto(result: Any, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lmsim.outputs import save_figure
    from lmsim.viz.style import policy_style

    key, points = pareto_points(result)
    if key is None or not points:
        return None
    x = "cost_per_hour" if result.objective == "cost" and all(p["cost_per_hour"] for p in points) else "gpus"
    attainment = key == "attainment"
    for p in points:  # lower is better on the y axis: plot attainment as the share missing
        p["plotted"] = 1 - p["value"] if attainment else p["value"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    markers = "osD^vPX*"
    kinds = sorted({(p["gpu"], p["shape"]) for p in points})  # marker: GPU and shape; colour: router
    for router in sorted({p["router"] for p in points}):
        style = policy_style(router)
        for i, kind in enumerate(kinds):
            mine = [p for p in points if p["router"] == router and (p["gpu"], p["shape"]) == kind]
            if mine:
                ax.scatter([p[x] for p in mine], [p["plotted"] for p in mine], color=style.color,
                           marker=markers[i % len(markers)], alpha=0.75, s=28,
                           label=f"{router} / {kind[0]} {kind[1]}")  # fmt: skip
    best = front([{**p, "value": p["plotted"]} for p in points], x)
    ax.step([p[x] for p in best], [p["value"] for p in best], where="post", color="black", lw=1.2,
            label="Pareto front")  # fmt: skip
    limit = _limit(result, key)
    if limit is not None:
        ax.axhline(1 - limit if attainment else limit, color="grey", ls="--", lw=1, label="SLO bound")
    ax.set_xlabel("cost per hour (USD)" if x == "cost_per_hour" else "GPUs")
    ax.set_ylabel("share of requests missing the SLO" if attainment else f"{key} (s)")
    ax.set_yscale("log" if not attainment and max(p["plotted"] for p in points) > 20 * limit_or(limit) else "linear")
    ax.set_title(f"Cost against {key}: every full-length probe")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def limit_or(limit: float | None) -> float:
    return limit if limit else 1.0


def _limit(result: Any, key: str) -> float | None:
    for st in result.stages:
        for s in st.searches.values():
            for p in s.probes.values():
                judged = p.get("judged", {}).get(key)
                if judged is not None:
                    return float(judged["limit"])
    return None


def write_outputs(result: Any, folder: Path) -> None:
    table = format_table(result)
    write_text(folder / PLAN_TABLE, table + "\n")
    data = {
        "objective": result.objective, "winner": result.winner, "tied": result.tied,
        "per_router": result.per_router, "per_router_on_slice": result.per_router_on_slice, "screened": result.screened, "infeasible": result.infeasible,
        "notes": result.notes, "stats": result.stats,
        "rows": [{k: v for k, v in r.items() if k != "closest"} for r in result.rows],
        "pareto": dict(zip(("metric", "points"), pareto_points(result), strict=True)),
    }  # fmt: skip
    write_text(folder / PLAN_JSON, json.dumps(data, indent=1, sort_keys=True, default=repr) + "\n")
    draw_pareto(result, folder / PARETO_FIGURE)
    if result.winner_experiment is not None:
        write_text(folder / WINNER_YAML, yaml.safe_dump(result.winner_experiment, sort_keys=False))
    else:
        (folder / WINNER_YAML).unlink(missing_ok=True)


def is_plan_dir(path: Path) -> bool:
    from lmsim.study.rundir import directory_kind

    return directory_kind(path) == "plan" and (path / PLAN_JSON).exists()


def find_plans(root: Path) -> list[Path]:
    """`root` when it is a finished plan, else every plan below it (any depth), in name order."""
    if is_plan_dir(root):
        return [root]
    found = []
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")):
        found.extend(find_plans(child))
    return found


def plan_section_html(folder: Path, title: str) -> str:
    """The plan's section of `lmsim report`: the verdict, the table, the Pareto figure and the
    winner's experiment, from the saved plan alone."""
    import base64
    import html

    data = json.loads((folder / PLAN_JSON).read_text())
    anchor = html.escape(title)
    parts = [f'<h2 id="{anchor}">{anchor}</h2>',
             f"<p>capacity plan (lmsim plan), objective {html.escape(str(data['objective']))}</p>"]  # fmt: skip
    table = (folder / PLAN_TABLE).read_text() if (folder / PLAN_TABLE).exists() else ""
    parts.append(f"<h3>designs</h3><pre>{html.escape(table)}</pre>")
    figure = folder / PARETO_FIGURE
    if figure.exists():
        b64 = base64.b64encode(figure.read_bytes()).decode()
        parts.append(f"<h3>cost against the tightest SLO metric</h3><img alt='pareto' src='data:image/png;base64,{b64}'>")
    winner = folder / WINNER_YAML
    if winner.exists():
        parts.append(f"<details><summary>the cheapest design as an experiment ({WINNER_YAML})</summary>"
                     f"<pre>{html.escape(winner.read_text())}</pre></details>")  # fmt: skip
    return "\n".join(parts)
