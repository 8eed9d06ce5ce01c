"""The OSO paper's reference results (reference/) and the comparisons with them (paper.py), applied by the
reporting only to grids the paper reports (its datasets, strategies and k)."""
