"""Presentation: plots (matplotlib, imported on use)."""
