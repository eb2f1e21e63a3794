"""Audit benchmark: the time and the peak memory of ``refkern.torch.audit`` on whole models, beside the
model's own eager forward measured in the same run.

    python benchmarks/bench_audit.py [--quick] [--json FILE]

Models (random weights, eval mode, under ``torch.no_grad()``): ResNet-18 as torchvision defines it
(built in tests/audit_models.py, batch-norm statistics randomised) on 1x3x224x224, and a small BERT
(transformers' BertModel, hidden 256, 4 layers, 4 heads, FFN 1024) on a batch of 1 x 128 tokens.
Each is timed eager (best of 3), fully audited (every element of every op), and audited with
``sample=4096`` elements per op. Kernels are compiled before the timing (one audit of a small
input). Memory: the resident set size is polled every millisecond during each run; the peak above
its value at the start of the run is reported, the audit's beside the eager forward's.

Issue 14's targets: ResNet-18 at 1x3x224x224 fully audited in <= 60 s on the 2-core machine, peak
memory <= 2x the eager forward's.
"""

import argparse
import json
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from audit_models import randomize_batch_norm, resnet18  # noqa: E402

import refkern.torch as rkt  # noqa: E402

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class Peak:
    """The peak resident set size above its value at entry, polled every millisecond."""

    def __enter__(self):
        self.start = _rss()
        self.peak = self.start
        self._stop = False
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self):
        while not self._stop:
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, _rss())
        self.mib = (self.peak - self.start) / 2**20
        return False


def _run(fn):
    with torch.no_grad(), Peak() as p:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
    return dt, p.mib, out


def measure(name, model, inputs, sample):
    call = (lambda: model(**inputs)) if isinstance(inputs, dict) else (lambda: model(inputs))
    eager = [_run(call) for _ in range(3)]
    t_eager, m_eager = min(e[0] for e in eager), max(e[1] for e in eager)

    def audited(**kw):
        def go():
            with rkt.audit(progress=False, **kw) as a:
                call()
            return a

        return go

    t_full, m_full, a_full = _run(audited())
    t_samp, m_samp, a_samp = _run(audited(sample=sample))
    row = dict(model=name, eager_s=t_eager, eager_peak_mib=m_eager, audit_s=t_full, audit_peak_mib=m_full,
               audit_vs_eager_time=t_full / t_eager, audit_vs_eager_memory=m_full / m_eager if m_eager else None,
               sample=sample, sampled_s=t_samp, sampled_peak_mib=m_samp, ops=a_full.n_ops, checked=a_full.n_checked,
               summary=a_full.summary(), not_checked=a_full.unchecked_summary(),
               sampled_summary=a_samp.summary())  # fmt: skip
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="ResNet-18 at 1x3x112x112, BERT on 32 tokens")
    p.add_argument("--sample", type=int, default=4096)
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "audit.json"))
    a = p.parse_args()
    torch.manual_seed(0)
    side = 112 if a.quick else 224
    resnet = randomize_batch_norm(resnet18()).eval()
    with torch.no_grad(), rkt.audit(progress=False):  # compile every kernel outside the timing
        resnet(torch.randn(1, 3, 32, 32))
    rows = [measure(f"resnet18 1x3x{side}x{side}", resnet, torch.randn(1, 3, side, side), a.sample)]
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: the BERT case is skipped (pip install transformers)")
    else:
        cfg = transformers.BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                      intermediate_size=1024, max_position_embeddings=512)  # fmt: skip
        bert = transformers.BertModel(cfg).eval()
        n = 32 if a.quick else 128
        ids = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(1))
        with torch.no_grad(), rkt.audit(progress=False):
            bert(input_ids=ids[:, :8])
        rows.append(measure(f"bert h256 L4 1x{n}", bert, {"input_ids": ids}, a.sample))
    head = f"{'model':<24}{'eager s':>9}{'audit s':>9}{'x eager':>9}{'sample s':>10}{'eager MiB':>11}{'audit MiB':>11}"
    print(head + f"{'x eager':>9}  ops checked")
    for r in rows:
        mem = f"{r['audit_vs_eager_memory']:.2f}" if r["audit_vs_eager_memory"] else "-"
        print(f"{r['model']:<24}{r['eager_s']:>9.3f}{r['audit_s']:>9.1f}{r['audit_vs_eager_time']:>9.0f}"
              f"{r['sampled_s']:>10.1f}{r['eager_peak_mib']:>11.1f}{r['audit_peak_mib']:>11.1f}{mem:>9}  "
              f"{r['checked']} of {r['ops']}")  # fmt: skip
    for r in rows:
        print(f"{r['model']}: {r['summary']}" + (f"; not checked: {r['not_checked']}" if r["not_checked"] else ""))
        print(f"{r['model']} sample={r['sample']}: {r['sampled_summary']}")
    r = rows[0]
    if not a.quick:
        ok_t = "met" if r["audit_s"] <= 60 else "MISSED"
        print(f"target: ResNet-18 1x3x224x224 fully audited: {r['audit_s']:.1f} s (<= 60) {ok_t}")
        ratio = r["audit_vs_eager_memory"]
        ok_m = "met" if ratio is not None and ratio <= 2 else "MISSED"
        print(f"target: ResNet-18 audit peak memory vs eager forward: {ratio:.2f}x (<= 2) {ok_m}")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"benchmark": "audit", "quick": a.quick, "threads": torch.get_num_threads(), "rows": rows}, f,
                  indent=1)  # fmt: skip
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
