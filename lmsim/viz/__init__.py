"""Figures and the HTML report, from saved results only. The package itself imports
nothing heavy: the command line reads `KINDS` to build its parser."""

# The figure kinds `lmsim plot --kind` draws (lmsim.viz.figures.PLOTTERS has one each).
KINDS = ("cdf", "rate", "param", "error", "hotspot")
