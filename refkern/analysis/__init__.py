"""Error analysis: distances in ulps, bounds, condition numbers and verdicts."""
