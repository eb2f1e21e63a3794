"""The route of batch_norm's gradients to their judge: a call whose input has no element (torch accepts it and
differentiates it: the input's gradient empty, the weight's and bias's +0) is judged as the adjoint call its rule
gives (:func:`refkern.kernels.batch_norm_grad.batch_norm_rule`: a sum over an empty axis, by
:func:`refkern.analysis.gradients.adjoint_report`); every other by the norms' envelope
(:func:`refkern.analysis.gradients.norm_report`)."""

__all__ = ["batch_norm_report"]


def batch_norm_report(op, name, adj, got, g, a, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for one gradient of batch_norm (module docstring)."""
    from refkern.analysis.gradients import adjoint_report, norm_report
    from refkern.kernels.batch_norm_grad import empty_input

    if empty_input(a):
        return adjoint_report(op, name, adj, got, g, a, who, rtol, atol)
    return norm_report(op, name, adj, got, g, a, who, rtol, atol)
