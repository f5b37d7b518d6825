"""Doubly robust analyses over per-row scores: average effects, projections, RATE, their results."""
