"""Mutation testing (mutate/run.py, make mutate)."""
