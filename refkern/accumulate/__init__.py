"""Exact and compensated accumulation: error-free transformations, the superaccumulator,
the fast exact dot/sum, and the named accumulation methods."""
