"""Drafter training (`python -m pipeline.train`)."""
