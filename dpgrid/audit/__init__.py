"""`dpgrid audit`: a measured lower bound on a grid's epsilon beside its claim (docs/audit.md).

command.py runs the audit (the grid once more, with canaries) and writes audit.json; canaries.py puts the canaries
into the grid's runs; bound.py turns their scores into the lower bound.
"""
