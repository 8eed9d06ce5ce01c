"""A grid's run directory: atomic files and its lock (files.py), whose results it may hold (claim.py), the committed
rows and resume (runs.py), learning curves (curves.py), and a random-stopping selection's draw and release
(selection.py)."""
