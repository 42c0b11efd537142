"""Rendering of simulation results: tables and plots (kept apart from the engine)."""
