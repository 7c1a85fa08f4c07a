"""The model families: which layers are binary, where BatchNorm sits, and the Bi-Real shortcuts."""
import pytest
import torch
from torch import nn

from bnn.layers import BinaryConv2d
from bnn.models import MODELS, BinaryUnit, binary_layers, build_model
from refimpl.genome import Genome

SHAPES = {"digits_net": (1, 8, 8)}
# 3x3 binary convolutions plus binary 1x1 downsampling convolutions (SPEC §6).
BINARY_LAYER_COUNT = {"resnet18": 16 + 3, "resnet34": 32 + 3, "vgg13": 9, "nin": 7, "digits_net": 3}


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
        "downsample": "binary",
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


def test_vgg_and_nin_refuse_inputs_they_were_not_built_for():
    with pytest.raises(ValueError, match="32x32"):
        build_model("vgg13", input_shape=(1, 8, 8))


def test_float_variant_has_the_same_parameter_shapes_without_alpha():
    binary = build_model("resnet18")
    plain = build_model("resnet18", binary=False)
    b = {k: v.shape for k, v in binary.state_dict().items() if not k.endswith("alpha")}
    f = {k: v.shape for k, v in plain.state_dict().items()}
    assert b == f
