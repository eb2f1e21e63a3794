"""Each op's tensor operands, in the order a command line or a file gives them, and how many a
call needs (the rest are optional: a bias, a weight, attention's mask). One table for the
command line and the torch adapter; it needs neither torch nor numba."""

OPERANDS = {"dot": ("x", "y"), "matmul": ("a", "b"), "linear": ("x", "weight", "bias"),
            "conv1d": ("x", "weight", "bias"), "conv2d": ("x", "weight", "bias"), "conv3d": ("x", "weight", "bias"),
            "conv_transpose1d": ("input", "weight", "bias"), "conv_transpose2d": ("input", "weight", "bias"),
            "conv_transpose3d": ("input", "weight", "bias"),
            "sum": ("x",), "mean": ("x",), "var": ("x",), "std": ("x",), "cumsum": ("x",),
            "layer_norm": ("input", "weight", "bias"), "rms_norm": ("input", "weight"),
            "group_norm": ("input", "weight", "bias"),
            "batch_norm": ("input", "running_mean", "running_var", "weight", "bias"),
            "avg_pool1d": ("input",), "avg_pool2d": ("input",), "max_pool1d": ("input",), "max_pool2d": ("input",),
            "adaptive_avg_pool1d": ("input",), "adaptive_avg_pool2d": ("input",), "softmax": ("input",),
            "log_softmax": ("input",),
            "scaled_dot_product_attention": ("query", "key", "value", "attn_mask")}  # fmt: skip

#: the products and convolutions take every operand positionally (torch's order); the other ops,
#: torch.nn.functional's signatures, take the tensors after the first by name
POSITIONAL = ("dot", "matmul", "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d")  # fmt: skip

REQUIRED = {**dict.fromkeys(POSITIONAL, 2), "batch_norm": 3, "scaled_dot_product_attention": 3}
