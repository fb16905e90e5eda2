"""Capacity planning (issue 37): the cheapest fleet that meets an SLO, with the router as a
design variable. `run_plan` is the entry point (`lmsim plan PLAN.yaml` calls it)."""

from lmsim.plan.config import PlanSection, load_plan
from lmsim.plan.run import PlanResult, run_plan

__all__ = ["PlanResult", "PlanSection", "load_plan", "run_plan"]
