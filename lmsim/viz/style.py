"""One colour and marker per routing policy, the same in every figure and panel.

`POLICY_STYLES` maps a policy name to its style; policies the table does not name get the
next unused colour/marker pair the first time they are drawn, and keep it for the rest of
the process. A policy (or a user's script) fixes its own with `register_style`:

    from lmsim.viz.style import register_style
    register_style("fewest_waiting", color="#17becf", marker="P")
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Style:
    color: str
    marker: str


# The seed's baselines first (Figures 22, 23), in colour-blind-safe Tableau hues; LMetric
# gets the strongest. Colours and markers both differ, so greyscale prints still separate.
POLICY_STYLES: dict[str, Style] = {
    "lmetric": Style("#d62728", "o"),
    "lmetric_hotspot": Style("#8c564b", "*"),
    "vllm": Style("#1f77b4", "s"),
    "bailian": Style("#ff7f0e", "^"),
    "dynamo": Style("#2ca02c", "D"),
    "aibrix": Style("#9467bd", "v"),
    "llmd": Style("#e377c2", "P"),
    "llmd_scorer": Style("#f7b6d2", "p"),
    "sglang": Style("#17becf", "X"),
    "preble": Style("#bcbd22", "<"),
    "polyserve": Style("#7f7f7f", ">"),
    "round_robin": Style("#aec7e8", "h"),
    "random": Style("#c7c7c7", "d"),
    "least_tokens": Style("#98df8a", "H"),
}
_SPARE_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")
_SPARE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def register_style(policy: str, *, color: str, marker: str = "o") -> Style:
    """Fix `policy`'s colour and marker for every later figure."""
    POLICY_STYLES[policy] = Style(color, marker)
    return POLICY_STYLES[policy]


def policy_style(policy: str) -> Style:
    """The policy's style; an unknown policy gets the next spare pair, kept from then on."""
    if policy not in POLICY_STYLES:
        used = {s.color for s in POLICY_STYLES.values()}
        spare = [c for c in _SPARE_COLORS if c not in used]
        n = len(POLICY_STYLES)
        color = spare[0] if spare else f"C{n % 10}"
        POLICY_STYLES[policy] = Style(color, _SPARE_MARKERS[n % len(_SPARE_MARKERS)])
    return POLICY_STYLES[policy]


# Linestyles separate variants of one policy (e.g. two lambdas of bailian) that share its colour.
VARIANT_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
