"""Analyses of saved results that ship with the bundled studies: the paper reproduction's
verdicts (`paper_verdicts`), its engine comparison, reduced-reproduction claims and seed
pairing, and the beyond experiments' tables. Each module runs as `python -m
lmsim.analysis.NAME`; the studies' shell recipes in lmsim/data/experiments call them so."""
