"""Tables and figures from the CSVs only (no torch, no opacus): tables.py writes them, figures.py draws the
curves, cells.py formats values; describe.py prints a plan (`dpgrid plan`)."""
