"""The whole step as one CUDA graph (issue 37 item 3, bnn/train/graph_step.py) and measure_impl triton in the
commands (item 1). On a CPU the captured step runs uncaptured: its arithmetic against a plain loop, its
divergence flag, its warm-up, and the ops it calls (none reads a value on the host or copies host data in,
which a capture refuses); on a GPU the same tests capture and replay it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _cli import run_main
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from bnn.gpu import require
from bnn.train import TrainConfig
from bnn.train import main as train_main
from bnn.train.graph_step import GraphStep

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# What a CUDA graph's capture refuses or cannot record: a value read on the host, a tensor made from host data.
HOST_OPS = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.lift_fresh", "aten.equal")


class _HostOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(HOST_OPS):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 5 * 5, 3)).to(DEVICE)


def _adam(net):
    return torch.optim.Adam(net.parameters(), lr=1e-2, fused=True, capturable=DEVICE.type == "cuda")


def _batches(n, poison=None):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(4, 3, 5, 5, generator=g)
        if i == poison:
            x[0, 0, 0, 0] = float("nan")
        out.append((x.to(DEVICE), torch.randint(0, 3, (4,), generator=g).to(DEVICE)))
    return out


def _plain(net, opt, batches):
    # The eager loop's arithmetic, written out: stop before the update of the first non-finite loss.
    loss_sum, correct, seen = 0.0, 0, 0
    for x, y in batches:
        logits = net(x)
        loss = F.cross_entropy(logits, y)
        if not torch.isfinite(loss):
            return loss_sum, correct, seen, True
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum += float(loss.detach()) * len(y)
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
    return loss_sum, correct, seen, False


def _graph(net, opt, batches):
    step = GraphStep(net, opt, 4, (3, 5, 5), DEVICE)
    for x, y in batches:
        step.run(x, y)
    sums = step.epoch_sums()
    return float(sums["loss_sum"]), int(sums["correct"]), sums["seen"], sums["diverged"], step


@pytest.mark.parametrize("poison", [None, 2])
def test_the_graph_step_trains_as_the_plain_loop_and_stops_updating_at_a_non_finite_loss(poison):
    batches = _batches(5, poison)
    want_net, got_net = _net(), _net()
    want_opt, got_opt = _adam(want_net), _adam(got_net)
    want = _plain(want_net, want_opt, batches)
    got = _graph(got_net, got_opt, batches)
    assert got[1:4] == want[1:4] and got[0] == pytest.approx(want[0], rel=1e-6)
    assert got[3] == (poison is not None) and got[2] == 4 * (5 if poison is None else poison)
    for p, q in zip(got_net.parameters(), want_net.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    steps = {float(s["step"]) for s in got_opt.state.values()}
    assert steps == {5.0 if poison is None else 2.0}, "a skipped update counts no Adam step"


def test_the_warm_up_before_the_capture_changes_no_parameter_statistic_or_adam_state():
    net = _net()
    opt = _adam(net)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    step = GraphStep(net, opt, 4, (3, 5, 5), DEVICE)
    step._prepare()
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in opt.state.values())
    assert float(step.bad) == 0 and int(step.ok_steps) == 0


def test_a_new_learning_rate_is_captured_again_and_used():
    batches = _batches(2)
    net, ref = _net(), _net()
    opt, ref_opt = _adam(net), _adam(ref)
    step = GraphStep(net, opt, 4, (3, 5, 5), DEVICE)
    step.run(*batches[0])
    _plain(ref, ref_opt, batches[:1])
    for o in (opt, ref_opt):
        o.param_groups[0]["lr"] = 1e-3
    step.run(*batches[1])
    _plain(ref, ref_opt, batches[1:])
    assert step.captured_lr == 1e-3
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_the_step_reads_no_value_on_the_host():
    net = _net()
    step = GraphStep(net, _adam(net), 4, (3, 5, 5), DEVICE)
    step._prepare()
    step.x.copy_(_batches(1)[0][0])
    with _HostOps() as spy:
        step._step()
    assert spy.seen == []
    with _HostOps() as spy:  # the spy sees a host read where there is one
        float(step.loss_sum)
    assert spy.seen == ["aten._local_scalar_dense.default"]


# -- measure_impl triton in the commands -------------------------------------------------------------

def test_triton_without_cuda_is_one_value_error_unless_interpreted(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = TrainConfig(measure_impl="triton", device="cpu")
    if require.triton_problem("cpu") is None:
        pytest.skip("triton is not installed")
    with pytest.raises(ValueError, match="on a CUDA device, not on cpu"):
        cfg.validate()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    TrainConfig(measure_impl="triton", device="cpu").validate()


def test_triton_missing_is_named_with_how_to_install_it(monkeypatch):
    monkeypatch.setattr(require.importlib.util, "find_spec", lambda name: None)
    assert "needs the triton package" in require.triton_problem("cuda")
    with pytest.raises(ValueError, match=r"pip install -e \"\.\[gpu\]\""):
        TrainConfig(measure_impl="triton", device="cpu").validate()


@pytest.mark.parametrize("command", ["train", "search"])
def test_the_commands_refuse_triton_on_the_cpu_in_one_line(monkeypatch, tmp_path, command):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if command == "train":
        r = run_main(train_main, "--no-progress", "--measure-impl", "triton", "--device", "cpu",
                     "--out", str(tmp_path / "run"))
    else:
        from bnn.search.cli import main as search_main

        r = run_main(search_main, "--measure-impl", "triton", "--device", "cpu", "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "measure_impl 'triton'" in r.stderr and not (tmp_path / "run").exists()
