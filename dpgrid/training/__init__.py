"""Training one run: per-sample gradient information (persample.py: the engines a strategy never sees) and
the loop of Poisson-sampled steps and validations (train.py)."""
