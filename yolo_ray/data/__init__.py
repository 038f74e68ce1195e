"""Datasets: the generated shapes set and the checks run before training."""
