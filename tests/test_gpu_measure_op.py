"""bnn/gpu's custom operator (issue 37 item 2): layers routed through ``bnn_gpu::measure`` compute the eager
layers' outputs and gradients, ``torch.library.opcheck`` passes, ``torch.compile`` traces one graph for 20
genomes, ``set_genome`` rewrites the genome in the tensors it already lives in, and a search worker's kept model
reset for a new genome equals a fresh build in the same tensors.

Runs under Triton's interpreter without a GPU (tests/test_gpu_measure_triton.py says why the sizes are small).
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch import nn

# Genomes that divide by zero on purpose: the interpreter's NumPy warns of the non-finite values compared.
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow) encountered:RuntimeWarning")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # TF32 convolutions (cuDNN's default) round dy to 10 bits: 1e-2 relative in dL/dx on an H200, not the measure's
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
pytest.importorskip("triton")

import refimpl  # noqa: E402
from bnn.gpu import measure_kernels as kernels  # noqa: E402
from bnn.gpu.measure_op import measure, set_genome, use_triton_measure  # noqa: E402
from bnn.nn.layers import BinaryConv2d, BinaryLinear, set_measure_grad_clip  # noqa: E402

if DEVICE == "cpu" and not kernels.INTERPRETED:
    pytest.skip("TRITON_INTERPRET was 0 before this module set it, and there is no GPU", allow_module_level=True)


def _net(genome, counts="raw", seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(BinaryConv2d(3, 5, 3, padding=1, measure=genome, counts=counts), nn.BatchNorm2d(5),
                        BinaryConv2d(5, 4, 1, stride=2, measure=genome, counts=counts), nn.BatchNorm2d(4),
                        nn.Flatten(), BinaryLinear(36, 3, measure=genome, counts=counts))
    with torch.no_grad():  # alphas away from their start, so their gradients differ per channel
        for m in net.modules():
            if isinstance(m, (BinaryConv2d, BinaryLinear)):
                m.alpha.add_(torch.rand_like(m.alpha) * 0.5)
    return net.to(DEVICE)


def _run(net, x, dy):
    x = x.clone().requires_grad_()
    out = net(x)
    out.backward(dy)
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in net.parameters()]
    return out.detach(), x.grad, grads


def _close(got, want, what):
    scale = float(want.abs().nan_to_num(0, 0, 0).max()) if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


# Well-conditioned measures: a divisor near zero makes the weight gradient a sum of terms of 1e10 that cancel
# to 1e3, which no two summation orders agree on (M5 on raw counts: 2048 against 0.0625). Those genomes are
# checked where the gradients leave the measure (tests/test_gpu_measure_triton.py); this test checks the
# plumbing around it: the window sums' backward, channels_last, the clip setting, alpha.
@pytest.mark.parametrize("genome, counts, clip, channels_last", [
    ("M5", "laplace", None, False), ("M1", "laplace", 10.0, True), ("0-16-17-15-8-9-4", "freq", None, True),
    ("baseline", "raw", 1.0, False)])
def test_routed_layers_match_the_eager_layers(genome, counts, clip, channels_last):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 6, 6, generator=g).to(DEVICE)
    x[0, :, :3, :3] = -1.0  # a blank region: a = c = 0 there
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    eager, routed = _net(genome, counts), use_triton_measure(_net(genome, counts))
    for net in (eager, routed):
        set_measure_grad_clip(net, clip)
    dy = torch.randn(2, 3, generator=g).to(DEVICE)
    want, got = _run(eager, x, dy), _run(routed, x, dy)
    _close(got[0], want[0], "output")
    _close(got[1], want[1], "dL/dx")
    for i, (a, b) in enumerate(zip(got[2], want[2])):
        _close(a, b, f"parameter {i}")


def test_mnist_net_routed_layers_match_its_eager_layers():
    # The network the GPU calibration trains (bench/gpu_calibration.sh): 28x28 inputs, 7x7 maps (49 pixels, no
    # power of two), binary 1x1 downsampling of stride 2, a searched genome on laplace counts with exp inside.
    # Layer by layer, each routed layer fed its eager twin's own input: end to end, the GPU's exp (within 2 ulp
    # of NumPy's) flips a sign somewhere in the network and the logits move by 3e-2 (as a +-2 ulp exp does in
    # the eager network: docs/performance.md, GPU), which says nothing about the kernels.
    from bnn.nn.models import mnist_net

    torch.manual_seed(0)
    eager = mnist_net("16-7-11-12-1-12-2", counts="laplace").to(DEVICE)
    routed = mnist_net("16-7-11-12-1-12-2", counts="laplace").to(DEVICE)
    routed.load_state_dict(eager.state_dict())
    routed = use_triton_measure(routed)
    inputs = {}
    layers = {name: m for name, m in eager.named_modules() if isinstance(m, BinaryConv2d)}
    hooks = [m.register_forward_pre_hook(lambda m, args, name=name: inputs.__setitem__(name, args[0].detach()))
             for name, m in layers.items()]
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        eager(torch.randn(2, 1, 28, 28, generator=g).to(DEVICE))
    for h in hooks:
        h.remove()
    assert len(inputs) == 9  # 7 units' convolutions and 2 downsampling convolutions
    twins = dict(routed.named_modules())
    for name, layer in layers.items():
        x = inputs[name]
        dy = torch.randn(layer(x).shape, generator=g).to(DEVICE)
        want, got = _run(layer, x, dy), _run(twins[name], x, dy)
        _close(got[0], want[0], f"{name} output")
        _close(got[1], want[1], f"{name} dL/dx")
        for (pname, _), a, b in zip(layer.named_parameters(), got[2], want[2]):
            # Summation order differs (the kernels' partial sums against autograd's): 1e-4 of the largest entry.
            scale = float(b.abs().max())
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * scale, msg=lambda m, n=f"{name}.{pname}": f"{n}: {m}")


def _op_args(genome="M7", counts="laplace"):
    net = use_triton_measure(_net(genome, counts))
    layer = net[0]
    x = torch.randn(2, 3, 5, 5).to(DEVICE)
    net(x)  # builds the layer's geometry and tables
    from bnn.gpu.counts import count_sums

    a, px, pw, round_counts = count_sums(torch.where(x >= 0, 1.0, -1.0), torch.where(layer.weight >= 0, 1.0, -1.0),
                                         (1, 1), (1, 1), (1, 1))
    return (a.detach().requires_grad_(), px.detach().requires_grad_(), pw.detach().requires_grad_(), layer._gpu_nsz,
            layer._gpu_rows, layer._gpu_codes, layer.alpha.detach().clone().requires_grad_(), layer._gpu_tab,
            layer._gpu_dtab, kernels.CONVENTION_CODES[counts], 1.0, round_counts)


def test_opcheck_passes():
    torch.library.opcheck(measure, _op_args())


def test_one_compiled_graph_serves_20_genomes():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    net = use_triton_measure(_net("baseline"))
    x = torch.randn(2, 3, 6, 6).to(DEVICE)
    net(x)  # eager: each layer's geometry and tables for this input size
    counter = CompileCounter()
    step = torch.compile(net, backend=counter, fullgraph=True)
    genomes = ["baseline"] + [str(refimpl.Genome(tuple(int(v) for v in row)))
                              for row in torch.randint(0, 14, (19, 7), generator=torch.Generator().manual_seed(3))]
    for i, genome in enumerate(genomes):
        set_genome(net, genome)
        out = step(x)
        if i % 6 == 0:  # the replayed graph computes this genome, not the first one, and differentiates
            _close(out.detach(), net(x).detach(), genome)
            out.sum().backward()
    assert counter.frame_count == 1, f"{counter.frame_count} graphs for {len(genomes)} genomes"


def test_set_genome_writes_in_place():
    net = use_triton_measure(_net("M1", "freq"))
    net(torch.randn(2, 3, 6, 6).to(DEVICE))
    layers = [m for m in net.modules() if isinstance(m, (BinaryConv2d, BinaryLinear))]
    assert len(layers) == 3
    names = ("_gpu_codes", "_gpu_tab", "_gpu_dtab", "_gpu_nsz", "_gpu_rows", "alpha")
    before = [[getattr(m, n).data_ptr() for n in names] for m in layers]
    set_genome(net, "M7")
    assert [[getattr(m, n).data_ptr() for n in names] for m in layers] == before
    m7 = refimpl.Genome.parse("M7")
    for m in layers:
        assert str(m.genome) == str(m7)
        assert m._gpu_codes.tolist() == list(m7.codes)
        assert torch.equal(m.alpha.detach().cpu(), torch.from_numpy(refimpl.default_alpha(m7, m.alpha.shape[1])).float())


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_one_cuda_graph_replays_every_genome():
    # Captured once with the baseline; set_genome rewrites the captured buffers, and each replay computes the
    # new genome (the forward; BatchNorm in training mode uses the batch's statistics).
    net = use_triton_measure(_net("baseline"))
    x = torch.randn(2, 3, 6, 6, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            net(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = net(x)
    for genome in ("M1", "M5", "M9", "0-16-17-15-8-9-4", "baseline"):
        set_genome(net, genome)
        graph.replay()
        _close(captured.detach().clone(), net(x).detach(), genome)


def test_a_kept_model_reset_for_a_new_genome_is_a_fresh_build_in_the_same_tensors():
    # What a search worker does between candidates under measure_impl triton (bnn/search/fitness.py Worker).
    from bnn.data import load_dataset
    from bnn.train import TrainConfig
    from bnn.train.loop import build_training, reset_training

    data = load_dataset("digits", None, None, 0, torch.device(DEVICE), train_size=8)
    first = TrainConfig(measure="M1", measure_impl="eager", device=DEVICE, counts="laplace", seed=3)
    _, model, opt, _ = build_training(first, data, torch.device(DEVICE), fused=True)
    use_triton_measure(model)  # routed, its geometry not built yet: no kernel runs in this test
    for p in model.parameters():  # as if trained: other parameters, and Adam's state
        p.grad = torch.randn_like(p)
    opt.step()
    ptrs = [t.data_ptr() for t in model.state_dict().values()]
    nxt = TrainConfig(measure="M6", measure_impl="triton", device=DEVICE, counts="laplace", seed=5, lr=1e-3)
    gen = reset_training(nxt, data, model, opt)
    want_gen, want, _, _ = build_training(dataclasses.replace(nxt, measure_impl="eager"), data, torch.device(DEVICE))
    assert [t.data_ptr() for t in model.state_dict().values()] == ptrs
    for (k, v), w in zip(model.state_dict().items(), want.state_dict().values()):
        assert torch.equal(v, w), k
    assert all(not t.any() for s in opt.state.values() for t in s.values())
    assert opt.param_groups[0]["lr"] == 1e-3 and torch.equal(gen.get_state(), want_gen.get_state())
    assert {str(m.genome) for m in model.modules() if hasattr(m, "_gpu_codes")} == {"3-0-3-0-0-10-6"}


def test_the_routed_layers_and_the_kernels_launchers_read_no_value_on_the_host():
    # What a CUDA graph's capture refuses (a value read on the host, a tensor made from host data), seen as the
    # ops torch dispatches; inside the custom op too, by calling its launchers directly.
    from torch.utils._python_dispatch import TorchDispatchMode

    host_ops = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.lift_fresh", "aten.equal")
    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func).startswith(host_ops):
                seen.append(str(func))
            return func(*args, **(kwargs or {}))

    net = use_triton_measure(_net("M5", "laplace"))
    x = torch.randn(2, 3, 6, 6).to(DEVICE)
    net(x)  # the geometry and tables: built once, before any capture
    args = [t.detach() if torch.is_tensor(t) else t for t in _op_args()]
    with Spy():
        net(x).sum().backward()
        y = kernels.forward(*args[:8], args[-1])
        kernels.backward(torch.ones_like(y), *args[:9], *args[9:])
    assert seen == []
    with Spy():
        y.sum().item()
    assert seen == ["aten._local_scalar_dense.default"]  # the spy sees one where there is one
