"""How a training step runs (issue 16 item 2): ``step`` picks eager, compiled (one compiled graph for
every genome, full batches only, fused Adam on CUDA) or graphs (CUDA graphs); auto is compiled on
CUDA (graphs with the Triton measure) and eager on the CPU; a kind the machine cannot run is one line, nothing written."""
import math

import pytest
import torch
from _cli import run_main

from bnn.search.fitness import fitness_config
from bnn.search.loop import SearchConfig
from bnn.train import TrainConfig, main, resolve_step, train_model
from bnn.train import loop as train_loop

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("step,compile_,device,kind", [
    ("auto", False, CPU, "eager"), ("auto", False, CUDA, "compiled"), ("auto", True, CPU, "compiled"),
    ("eager", False, CUDA, "eager"), ("compiled", False, CPU, "compiled"), ("compiled", True, CUDA, "compiled"),
    ("graphs", False, CUDA, "graphs"),
])
def test_each_step_setting_resolves_to_its_kind_on_each_device(step, compile_, device, kind):
    assert resolve_step(TrainConfig(step=step, compile=compile_), device) == kind


@pytest.mark.parametrize("step,compile_,device,kind", [
    ("auto", False, CUDA, "graphs"), ("auto", False, CPU, "eager"), ("auto", True, CUDA, "compiled"),
    ("compiled", False, CUDA, "compiled"), ("eager", False, CUDA, "eager"),
])
def test_auto_captures_the_whole_step_on_cuda_with_the_triton_measure(step, compile_, device, kind):
    # The Triton measure takes the genome as data, so one captured graph serves every genome: the fastest
    # step measured on a GPU. An explicit step, or compile=True, is kept.
    assert resolve_step(TrainConfig(step=step, compile=compile_, measure_impl="triton"), device) == kind


@pytest.mark.parametrize("step,compile_,device,words", [
    ("graphs", False, CPU, "needs a CUDA device"), ("eager", True, CPU, "clashes with step='eager'"),
    ("graphs", True, CUDA, "clashes"), ("fast", False, CPU, "step must be one of auto, eager, compiled, graphs"),
])
def test_a_step_the_machine_or_the_other_settings_cannot_take_is_one_value_error(step, compile_, device, words):
    with pytest.raises(ValueError, match=words):
        resolve_step(TrainConfig(step=step, compile=compile_), device)


def test_graphs_on_the_cpu_is_refused_by_the_command_before_any_folder(tmp_path):
    out = tmp_path / "run"
    r = run_main(main, "--no-progress", "--step", "graphs", "--device", "cpu", "--out", str(out))
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "needs a CUDA device" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("images,batch,kind,steps", [
    (100, 32, "eager", 4), (100, 32, "compiled", 3), (100, 32, "graphs", 3), (96, 32, "compiled", 3),
    (20, 32, "compiled", 1), (45_000, 128, "compiled", 351), (45_000, 128, "eager", 352),
])
def test_compiled_kinds_take_full_batches_and_eager_every_image(images, batch, kind, steps):
    assert train_loop.steps_per_epoch(images, batch, kind) == steps
    assert steps == (math.ceil(images / batch) if kind == "eager" or images < batch else images // batch)


def test_a_compiled_training_runs_full_batches_through_one_graph_with_the_measure_operator(monkeypatch):
    # aot_eager: TorchDynamo and AOTAutograd as inductor would get them, without its C++ compile.
    monkeypatch.setattr(train_loop, "COMPILE_BACKEND", "aot_eager")
    real = train_loop.compiled_forward
    batches, models = [], []

    def spy(model, kind, *rest):
        forward = real(model, kind, *rest)
        models.append(model)

        def counted(x):
            batches.append(len(x))
            return forward(x)
        return counted

    monkeypatch.setattr(train_loop, "compiled_forward", spy)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cfg = TrainConfig(measure="M1", epochs=2, batch_size=32, train_size=100, step="compiled", eval_test=False)
    result = train_model(cfg)
    assert result.status == "ok" and result.epochs == 2
    assert batches == [32] * 6  # 100 // 32 full batches an epoch, the ragged 4 images never a batch
    layers = [m for m in models[0].modules() if hasattr(m, "_measure_codes")]
    assert layers, "the compiled kind routes the binary layers through bnn::measure"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1, "the step never went through TorchDynamo"


def test_the_search_hands_its_step_to_every_fitness_training():
    train = SearchConfig(dataset="digits", step="eager").train_dict()
    assert train["step"] == "eager" and fitness_config(train, "M1").step == "eager"
    old = {k: v for k, v in train.items() if k != "step"}  # a journal from before the setting
    assert fitness_config(old, "M1").step == "auto"
