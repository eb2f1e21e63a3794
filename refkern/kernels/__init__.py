"""Reference kernels with torch semantics: matmul, linear, conv1d, conv2d."""
