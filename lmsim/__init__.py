"""lmsim: a discrete-event simulator of an LLM serving cluster.

A cluster is a router in front of vLLM-v1-like instances on one SimPy clock. The data flows
one way: experiment YAML -> validated config -> workload -> cluster -> per-request records ->
summaries and figures.
"""

__version__ = "0.1.0"
