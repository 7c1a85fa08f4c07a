"""``bnn.nn.measure_op`` (issue 16 item 1): routing the measure through one opaque operator changes no output and
no gradient, and under torch.compile a model built for a new genome runs without recompiling, where the
layers' own measure recompiles."""
import pytest
import torch
from torch import nn

from bnn.nn.layers import BinaryConv2d, BinaryLinear
from bnn.nn.measure_op import use_measure_op

# Paper measures, a learnable-alpha genome, and one with constant slots (alpha, zero) so that some
# counts get no gradient at all.
GENOMES = ["baseline", "M1", "M5", "M9", "0-0-16-17-3-1-4", "15-1-0-0-0-1-0"]


def _net(genome: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(BinaryConv2d(5, 6, 3, stride=1, padding=1, measure=genome), nn.BatchNorm2d(6),
                        BinaryConv2d(6, 4, 1, stride=2, measure=genome), nn.BatchNorm2d(4), nn.Flatten(),
                        BinaryLinear(4 * 3 * 3, 3, measure=genome))
    with torch.no_grad():  # alphas away from their start, so their gradients differ per channel
        for m in net.modules():
            if hasattr(m, "alpha"):
                m.alpha.add_(torch.rand_like(m.alpha) * 0.5)
    return net


def _run(net: nn.Module, forward=None, seed: int = 1):
    """Output, input gradient and parameter gradients (None as zeros) of one forward and backward."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, 6, 6, generator=g, requires_grad=True)
    out = (forward or net)(x)
    out.backward(torch.randn(out.shape, generator=g))
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in net.named_parameters()}
    return out.detach(), x.grad, grads


def _assert_same(a, b):
    out_a, gx_a, grads_a = a
    out_b, gx_b, grads_b = b
    assert torch.equal(out_a, out_b)  # the same eager measure, the same order: identical forward
    # Backward: the counts' backward sums the four count gradients; the original path gets autograd's
    # shared tensors and merges them (2 * (g + g)), the operator's are separate (g + g + g + g), so
    # they may differ in the last bit before the convolutions' sums.
    torch.testing.assert_close(gx_a, gx_b, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)


@pytest.mark.parametrize("genome", GENOMES)
def test_the_operator_gives_the_layers_outputs_and_gradients(genome):
    _assert_same(_run(_net(genome)), _run(use_measure_op(_net(genome))))


def test_a_constant_slot_gets_exactly_zero_gradient_from_the_operator():
    # 15-1-...: a' = alpha and d' = 0, so a and d reach nothing; alpha rows 1..3 are unused.
    net = use_measure_op(_net("15-1-0-0-0-1-0"))
    _, _, grads = _run(net)
    assert torch.count_nonzero(grads["0.alpha"][1:]) == 0
    assert torch.count_nonzero(grads["0.alpha"][0]) > 0


def _compiled_run(genome: str, measure_op: bool):
    net = _net(genome)
    if measure_op:
        use_measure_op(net)
    # aot_eager: TorchDynamo decides guards and recompiles before any backend runs, and AOTAutograd
    # traces the operator's fake and backward as for inductor, without generating code.
    return _run(net, torch.compile(net, backend="aot_eager"))


def test_a_new_genome_reuses_the_compiled_graph_with_the_operator():
    torch._dynamo.reset()
    first = _compiled_run("baseline", measure_op=True)
    _assert_same(_run(_net("baseline")), first)
    with torch.compiler.set_stance("fail_on_recompile"):
        for genome in ("M1", "0-0-16-17-3-1-4"):
            _assert_same(_run(_net(genome)), _compiled_run(genome, measure_op=True))


def test_without_the_operator_a_new_genome_recompiles():
    # The control: the same check fails on the layers' own measure, so the test above can fail.
    torch._dynamo.reset()
    _compiled_run("baseline", measure_op=False)
    with torch.compiler.set_stance("fail_on_recompile"), pytest.raises(Exception, match="(?i)recompil"):
        _compiled_run("M1", measure_op=False)
