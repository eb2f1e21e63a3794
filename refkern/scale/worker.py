"""What runs on a worker: a message's ops rebuilt from its header and bits, each judged by
``compare`` (or ``compare_backward``), the verdicts returned in the header's order."""

from refkern.scale.bits import nbytes_of, tensor_at, unpack
from refkern.scale.header import fill, read_header

__all__ = ["judge", "judge_bundle"]


def _why(exc) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def judge(kind, op, actual, args, kwargs):
    """``compare`` (kind "forward") or ``compare_backward`` (kind "backward") of the call, as
    ("ok", result) or ("error", "Type: message") (the analysis' own failure)."""
    from refkern.analysis.compare import compare
    from refkern.gradients import compare_backward

    try:
        if kind == "forward":
            return "ok", compare(actual, op, *args, **kwargs)
        grad_output, *rest = args
        return "ok", compare_backward(actual, op, grad_output, *rest, **kwargs)
    except Exception as exc:  # reported as the op's note, as a local audit does
        return "error", _why(exc)


def _params(params) -> dict:
    """pid -> (its blob's bits, offset, dtype, shape), from blobs (first pid, [(dtype, shape)], packed bits)."""
    where = {}
    for first, metas, packed in params:
        sizes = [(nbytes_of(dt, (1,)), nbytes_of(dt, shape)) for dt, shape in metas]
        raw, off = unpack(packed, sizes), 0
        for i, (dt, shape) in enumerate(metas):
            where[first + i] = (raw, off, dt, shape)
            off += nbytes_of(dt, shape)
    return where


def judge_bundle(header: bytes, blob: bytes, params: list) -> list:
    """The verdicts of a message's ops, in the header's order (:mod:`refkern.scale.header`).

    ``blob``: the embedded tensors' bits, packed (:func:`refkern.scale.bits.pack`) in the order
    the rows name them; ``params``: the parameter blobs the ops read, each (first pid,
    [(dtype, shape)], their bits packed)."""
    from refkern.scale._states import limit_threads

    limit_threads()
    _, defs, rows = read_header(header)
    if defs is None:
        why = "RuntimeError: refkern on this worker is not the client's version (its vocabulary differs); install one"
        return [("error", why)] * rows
    ndefs = len(defs)
    ops = []  # (template, refs)
    embedded = []  # (dtype, shape) of each tensor of the blob, in order
    for items in rows:
        refs = [defs[i] if i < ndefs else i - ndefs for i in items[1:]]
        embedded += [r for r in refs if isinstance(r, tuple) and isinstance(r[0], str)]
        ops.append((defs[items[0]], refs))
    raw = unpack(blob, [(nbytes_of(dt, (1,)), nbytes_of(dt, shape)) for dt, shape in embedded])
    where = _params(params)
    out, off = [], 0
    for (op, struct, *kind), refs in ops:
        kind = kind[0] if kind else "forward"
        spots = []  # where each embedded tensor's bits are (the blob is read in order, whatever fails)
        for r in refs:
            if isinstance(r, tuple) and isinstance(r[0], str):
                spots.append(off)
                off += nbytes_of(*r)
        try:
            at = iter(spots)
            tensors = []
            for r in refs:
                if isinstance(r, int):
                    tensors.append(tensor_at(*where[r]))
                elif isinstance(r[0], str):
                    tensors.append(tensor_at(raw, next(at), *r))
                else:
                    pid, o, shape, stride = r
                    tensors.append(tensor_at(*where[pid]).reshape(-1).as_strided(shape, stride, o))
            actual, args, kwargs = fill(struct, iter(tensors))
        except Exception as exc:
            out.append(("error", _why(exc)))
            continue
        out.append(judge(kind, op, actual, args, kwargs))
    return out
