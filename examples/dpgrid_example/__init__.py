"""An example dpgrid plugin package: a strategy, a model and a dataset, each one module and one config."""
