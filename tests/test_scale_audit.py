"""The audit on a two-worker local cluster: the same verdict per op as a local audit (fp32 and
bf16 models, forward and backward), a worker killed mid-audit loses nothing, each parameter is
shipped once, operands travel as raw bits."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("distributed")

from torch import nn  # noqa: E402

import refkern.torch as rkt  # noqa: E402
from refkern.scale import remote  # noqa: E402


class Shared(nn.Module):
    """A linear layer used twice (its weight read by two ops), a norm, a conv, a softmax."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 24)
        self.norm = nn.LayerNorm(24)
        self.conv = nn.Conv1d(1, 2, 3, padding=1)
        self.out = nn.Linear(48, 10)

    def forward(self, x):
        h = self.norm(self.fc(torch.relu(self.fc(x))))
        h = self.conv(h[:, None, :]).flatten(1)
        return torch.softmax(self.out(h), -1)


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    return Shared().to(dtype), torch.randn(6, 24).to(dtype)


def _audit(m, x, backward=False, **kw):
    with rkt.audit(progress=False, **kw) as a:
        if backward:
            m(x).sum().backward()
        else:
            with torch.no_grad():
                m(x)
    return a


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cluster_audit_equals_local(client, dtype):
    m, x = _model(dtype)
    local = _audit(m, x)
    far = _audit(m, x, client=client)
    assert far.to_dict() == local.to_dict()
    assert far.report() == local.report()
    judged = [c for c in far.calls if c.report is not None]
    assert len(judged) >= 5 and {c.verdict for c in judged} <= {"exact", "rounding"}
    st = far._remote.stats
    params = list(m.parameters())
    assert st["params_scattered"] == len(params)  # fc's weight and bias read twice, shipped once
    assert st["param_bytes"] == sum(p.numel() * p.element_size() for p in params)
    assert st["shipped_bytes"] <= 1.1 * st["operand_bytes"]


def test_cluster_audit_backward_and_sample(client):
    def fresh():  # gradients accumulate: each audit its own model
        m, x = _model(torch.float32, seed=1)
        return m, x.requires_grad_(True)

    far, local = _audit(*fresh(), backward=True, client=client), _audit(*fresh(), backward=True)
    assert far.to_dict() == local.to_dict()
    assert any(c.phase == "backward" and c.report is not None for c in far.calls)
    m, x = _model(torch.float32, seed=2)
    assert _audit(m, x, sample=7, client=client).to_dict() == _audit(m, x, sample=7).to_dict()


@pytest.mark.parametrize("bundle", [0, remote.BUNDLE], ids=["alone", "bundled"])
def test_a_worker_killed_mid_audit_loses_nothing(client, monkeypatch, bundle):
    import signal

    m, x = _model(torch.float32, seed=3)
    local = _audit(m, x)
    pids = client.run(os.getpid)  # worker address -> process id
    submit = remote.Remote.submit
    killed = []
    monkeypatch.setattr(remote, "BUNDLE", bundle)  # 0: every op its own task

    def kill_after_two(self, *args, **kwargs):
        job = submit(self, *args, **kwargs)
        if len(self.jobs) == 2 and not killed:  # a worker (its tasks, the parameters scattered to it) dies
            futs = [f for f in (job.future, *(v[1][0] for v in self._params.values() if v[1])) if f is not None]
            held = self.client.who_has(futs[:1]).get(futs[0].key) if futs else None
            killed.append((held or sorted(pids))[0])
            os.kill(pids[killed[0]], signal.SIGKILL)
        return job

    monkeypatch.setattr(remote.Remote, "submit", kill_after_two)
    far = _audit(m, x, client=client)
    assert killed
    assert far.to_dict() == local.to_dict()
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it


def test_raw_bits_round_trip():
    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64, torch.bool):
        t = (torch.randn(3, 5) * 1e3).to(dt)
        if dt.is_floating_point:
            t[0, 0], t[0, 1], t[0, 2] = -0.0, float("nan"), float("inf")
        back = remote.from_bits(remote.to_bits(t.t()))
        assert back.dtype == t.dtype and back.shape == t.t().shape
        assert torch.equal(back.reshape(-1).view(torch.uint8), t.t().contiguous().reshape(-1).view(torch.uint8))


def test_client_must_be_a_client():
    with pytest.raises(TypeError, match=r"^audit: client must be a dask.distributed.Client"):
        rkt.audit(client="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"^audit: budget must be a positive number of bytes"):
        remote.Remote(None, budget=0)
