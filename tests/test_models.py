"""The model families: which layers are binary, where BatchNorm sits, and the Bi-Real shortcuts."""
import pytest
import torch
from torch import nn

from bnn.nn.layers import BinaryConv2d
from bnn.nn.models import MODELS, BinaryUnit, binary_layers, build_model
from refimpl.genome import Genome

SHAPES = {"digits_net": (1, 8, 8), "mnist_net": (1, 28, 28)}
# 3x3 binary convolutions plus binary 1x1 downsampling convolutions (docs/design.md section 6).
BINARY_LAYER_COUNT = {"resnet18": 16 + 3, "resnet34": 32 + 3, "vgg13": 9, "nin": 7, "digits_net": 3,
                      "mnist_net": 7 + 2}


def test_the_settings_name_every_model_the_commands_offer_in_their_help():
    # bnn.settings.MODEL_NAMES is what --help and bnn.diagnose's --model choices show without torch.
    from bnn.settings import MODEL_NAMES

    assert tuple(MODELS) == MODEL_NAMES


def _build(name, measure="baseline", num_classes=10):
    return build_model(name, measure, num_classes, SHAPES.get(name, (3, 32, 32)))


@pytest.mark.parametrize("name", list(MODELS))
def test_model_outputs_logits_for_its_input_shape(name):
    torch.manual_seed(0)
    model = _build(name, num_classes=7)
    x = torch.randn(2, *model.config["input_shape"])
    assert model(x).shape == (2, 7)
    assert model.config == {
        "arch": name, "measure": "0-0-0-0-0-0-1", "num_classes": 7, "input_shape": list(x.shape[1:]),
        "downsample": "binary", "counts": "raw",
    }


@pytest.mark.parametrize("name", list(MODELS))
def test_only_stem_and_classifier_are_full_precision(name):
    model = _build(name)
    float_convs = [m for m in model.modules() if type(m) is nn.Conv2d]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert float_convs == [model.stem]
    assert linears == [model.classifier]
    assert len(binary_layers(model)) == BINARY_LAYER_COUNT[name]


@pytest.mark.parametrize("name", list(MODELS))
def test_every_binary_layer_is_followed_by_its_own_batchnorm(name):
    model = _build(name)
    owned = []
    for unit in model.modules():
        if isinstance(unit, BinaryUnit):
            assert isinstance(unit.bn, nn.BatchNorm2d) and unit.bn.num_features == unit.conv.out_channels
            owned.append(unit.conv)
            if unit.down_conv is not None:
                assert unit.down_bn.num_features == unit.down_conv.out_channels
                owned.append(unit.down_conv)
    assert {id(m) for m in owned} == {id(m) for m in binary_layers(model)}
    # The body holds only units and pooling, so an exporter meets nothing else.
    assert all(isinstance(m, (BinaryUnit, nn.MaxPool2d, nn.AvgPool2d)) for m in model.body)


@pytest.mark.parametrize("name", list(MODELS))
def test_one_genome_for_every_binary_layer(name):
    model = _build(name, "M9")
    assert {layer.genome for layer in binary_layers(model)} == {Genome.parse("M9")}
    assert model.config["measure"] == "3-2-3-10-0-4-6"


@pytest.mark.parametrize("arch", ["resnet18", "resnet34"])
def test_resnet_has_a_real_shortcut_around_every_binary_conv(arch):
    model = _build(arch)
    units = list(model.body)
    assert all(u.residual for u in units)
    assert sum(u.down_conv is not None for u in units) == 3
    for u in units:
        if u.down_conv is not None:
            assert isinstance(u.down_conv, BinaryConv2d) and u.down_conv.kernel_size == (1, 1)
            assert u.down_conv.stride == 2
    # An identity unit adds its input unchanged to bn(conv(x)) (up to the rounding of the sum).
    unit = units[0]
    unit.eval()
    x = torch.randn(2, 64, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(unit(x) - unit.bn(unit.conv(x)), x, atol=1e-4, rtol=0)


def test_widths_and_depth_of_cifar_resnets():
    for arch, blocks in (("resnet18", (2, 2, 2, 2)), ("resnet34", (3, 4, 6, 3))):
        widths = [u.conv.out_channels for u in _build(arch).body]
        expected = [w for w, n in zip((64, 128, 256, 512), blocks) for _ in range(2 * n)]
        assert widths == expected


def test_unknown_model_and_measure_raise_value_error():
    with pytest.raises(ValueError, match="unknown model 'resnet99'.*resnet18"):
        build_model("resnet99")
    with pytest.raises(ValueError, match="genome"):
        build_model("resnet18", "M11")


def _map_sizes(model, x):
    """(channels, height, width) after the stem and after every body layer, from forward hooks."""
    sizes = []
    hooks = [m.register_forward_hook(lambda m, i, o: sizes.append(tuple(o.shape[1:])))
             for m in (model.stem, *model.body)]
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    return sizes


@pytest.mark.parametrize("name", list(MODELS))
def test_every_family_runs_on_mnist_shaped_inputs(name):
    # Issue 15: each family adapts to 1x28x28 or refuses with a reason; all of them adapt.
    torch.manual_seed(0)
    model = build_model(name, num_classes=10, input_shape=(1, 28, 28))
    with torch.no_grad():
        out = model.eval()(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_vgg13_pools_28x28_down_to_1x1_like_32x32():
    # An odd map pads one row and column, so 7x7 pools to 4x4 and its last row is kept.
    for side, pooled in ((28, [14, 7, 4, 2, 1]), (32, [16, 8, 4, 2, 1])):
        model = build_model("vgg13", input_shape=(1, side, side))
        sizes = _map_sizes(model, torch.randn(1, 1, side, side))
        pools = [s[1:] for s, m in zip(sizes[1:], model.body) if isinstance(m, nn.MaxPool2d)]
        assert pools == [(p, p) for p in pooled]


def test_mnist_net_stages_on_28x28():
    model = build_model("mnist_net", input_shape=(1, 28, 28))
    assert model.stem.stride == (2, 2)
    assert _map_sizes(model, torch.randn(2, 1, 28, 28)) == [
        (32, 14, 14), (32, 14, 14), (64, 7, 7), (64, 7, 7), (64, 7, 7), (128, 4, 4), (128, 4, 4), (128, 4, 4)]
    units = list(model.body)
    assert all(isinstance(u, BinaryUnit) and u.residual and u.conv.kernel_size == (3, 3) for u in units)
    # The two stride-2 units carry the downsampling shortcut; the others add their input.
    assert [u.down_conv is not None for u in units] == [False, True, False, False, True, False, False]


@pytest.mark.parametrize("binary", [True, False])
def test_mnist_net_forward_and_backward(binary):
    torch.manual_seed(0)
    model = build_model("mnist_net", "baseline", 10, (1, 28, 28), binary=binary)
    x = torch.randn(4, 1, 28, 28)
    loss = nn.functional.cross_entropy(model(x), torch.tensor([0, 3, 7, 9]))
    loss.backward()
    assert model(x).shape == (4, 10)
    # Every weight and BatchNorm gets a finite, nonzero gradient (alpha rows of slots whose
    # operator ignores alpha get none, by design).
    for name, p in model.named_parameters():
        if not name.endswith("alpha"):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_mnist_net_parameter_count():
    # By hand: 3x3 weights 32*32 + 32*64 + 2*64*64 + 64*128 + 2*128*128 (x9), 1x1 downsampling
    # 32*64 + 64*128, stem 1*32*9, BatchNorms 2 * (the stem's 32 + every binary layer's outputs),
    # classifier 128*10 + 10.
    outs = (32, 64, 64, 64, 64, 128, 128, 128, 128)  # 7 units' convs and 2 downsampling convs
    weights = 9 * (32 * 32 + 32 * 64 + 2 * 64 * 64 + 64 * 128 + 2 * 128 * 128) + 32 * 64 + 64 * 128
    plain = weights + 288 + 2 * (32 + sum(outs)) + 1290
    assert plain == 483_498
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(build_model("mnist_net", input_shape=(1, 28, 28), binary=False)) == plain
    # Binary layers add alpha: one row of out_channels per unary slot (4).
    assert count(build_model("mnist_net", input_shape=(1, 28, 28))) == plain + 4 * sum(outs)


def test_float_variant_has_the_same_parameter_shapes_without_alpha():
    binary = build_model("resnet18")
    plain = build_model("resnet18", binary=False)
    b = {k: v.shape for k, v in binary.state_dict().items() if not k.endswith("alpha")}
    f = {k: v.shape for k, v in plain.state_dict().items()}
    assert b == f


@pytest.mark.parametrize("arch,downsample", [("mnist_net", "binary"), ("mnist_net", "real"), ("vgg13", "binary")])
def test_28x28_layers_new_to_the_engine_match_torch(arch, downsample, tmp_path):
    # mnist_net's stride-2 stem and vgg13's padded 2x2 max-pools on odd maps, exported and run
    # by the CPU engine: the same logits as the torch model.
    from _engine_models import assert_logits_close, fresh_model, torch_logits

    from bnn.export import export_model
    from refimpl import engine

    torch.manual_seed(5)
    # Smooth images (a 9x9 box filter of noise), so activations are not all near zero.
    x = nn.functional.avg_pool2d(torch.randn(12, 1, 36, 36), 9, stride=1)[:, :, :28, :28] * 3
    model = fresh_model(arch, "baseline", (1, 28, 28), x, downsample=downsample)
    export_model(model, str(tmp_path / "m.bnn"))
    xs = x.numpy().copy()
    assert_logits_close(engine.load(str(tmp_path / "m.bnn")).run(xs), torch_logits(model, xs))
