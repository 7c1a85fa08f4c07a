"""One source for every setting (issue 17 item 6): the paper's fitness settings live in
``bnn.settings`` and everything else (the training presets, the search's defaults and paper
preset, the workers' trainings, both --help texts) reads them; the gene limits come from refimpl's
operator table; and a settings mapping with a key no config has is refused, never dropped."""
import dataclasses
import json

import numpy as np
import pytest
import torch

import refimpl
from bnn import settings
from bnn import train as bnn_train
from bnn.search import cli as search_cli
from bnn.search.fitness import fitness_config, planted_target
from bnn.search.loop import SearchConfig
from bnn.search.variation import GENES, N_UNARY_SLOTS, gene_limits
from bnn.settings import FITNESS, PRESETS
from bnn.train import TrainConfig

# The paper's fitness (docs/design.md section 7), written out by hand.
PAPER = dict(epochs=15, batch_size=128, lr=5e-3, milestones=(), thresholds=(0.11, 0.25, 0.35, 0.40),
             threshold_steps=(0, 100, 200, 300))


def test_the_owner_holds_the_papers_fitness_settings():
    assert {k: getattr(FITNESS, k) for k in PAPER} == PAPER
    with pytest.raises(dataclasses.FrozenInstanceError):
        FITNESS.epochs = 3


def test_search_defaults_and_paper_preset_are_the_papers_fitness():
    cfg = SearchConfig()
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.thresholds, cfg.threshold_steps, cfg.population) == (
        15, 128, 5e-3, [0.11, 0.25, 0.35, 0.40], [0, 100, 200, 300], 30)
    paper = search_cli.PRESETS["paper"]
    assert (paper["epochs"], paper["thresholds"], paper["threshold_steps"], paper["population"]) == (
        15, [0.11, 0.25, 0.35, 0.40], [0, 100, 200, 300], 30)


def test_a_changed_owner_changes_every_reader(monkeypatch):
    # The presets are derived when bnn.settings is imported; the readers below look the owner up
    # each time, so a different owner must show in each of them.
    other = settings.FitnessSettings(epochs=7, batch_size=33, lr=0.125, thresholds=(0.5,), threshold_steps=(0,))
    monkeypatch.setattr(search_cli, "FITNESS", other)
    monkeypatch.setattr(search_cli, "PAPER_POPULATION", 11)
    text = " ".join(search_cli.build_parser().format_help().split())
    for words in ("paper: 7)", "(default 33)", "(default 0.125)", "e.g. 0.5 (the paper's)", "S=11, 7 epochs",
                  "paper: 11)"):
        assert words in text, words
    monkeypatch.setitem(PRESETS, "fitness", other.schedule())
    text = " ".join(bnn_train._parser().format_help().split())
    for words in ("fitness 7", "fitness 33", "fitness 0.125"):
        assert words in text, words
    import bnn.search.fitness as fitness_module

    monkeypatch.setattr(fitness_module, "FITNESS", dataclasses.replace(FITNESS, milestones=(2,), gamma=0.5))
    cfg = fitness_config(SearchConfig(device="cpu").train_dict(), "M1")
    assert (cfg.milestones, cfg.gamma) == ((2,), 0.5)


def test_a_fitness_training_is_the_search_setting_at_a_constant_lr_without_files():
    search = SearchConfig(epochs=2, batch_size=64, lr=0.01, train_seed=9, val_size=100, train_size=500, device="cpu",
                          downsample="real")
    cfg = fitness_config(search.train_dict(), "M1")
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.seed, cfg.val_size, cfg.train_size, cfg.downsample) == (
        2, 64, 0.01, 9, 100, 500, "real")
    assert (cfg.measure, cfg.milestones, cfg.out_dir, cfg.eval_test) == ("M1", (), None, False)


def test_train_config_from_mapping_refuses_a_typo_and_names_the_valid_keys():
    with pytest.raises(ValueError) as err:
        TrainConfig.from_mapping({"epochs": 2, "lrr": 0.1})
    msg = str(err.value)
    assert "\n" not in msg and "'lrr'" in msg and "lr," in msg and "epochs" in msg
    assert TrainConfig.from_mapping({"epochs": 2, "lr": 0.1}) == TrainConfig(epochs=2, lr=0.1)


def test_a_fitness_training_built_with_a_typo_fails_loudly(monkeypatch):
    # A key TrainConfig lacks, as a misspelt setting in the workers' mapping would be: refused.
    real = TrainConfig.from_mapping.__func__

    def with_typo(cls, mapping):
        return real(cls, {**mapping, "milestone": ()})

    monkeypatch.setattr(TrainConfig, "from_mapping", classmethod(with_typo))
    with pytest.raises(ValueError, match="'milestone'"):
        fitness_config(SearchConfig(device="cpu").train_dict(), "M1")


def test_train_resume_refuses_a_checkpoint_setting_it_does_not_know(tmp_path, capsys):
    # Written by another version: a setting this one lacks would change what --resume runs.
    run = tmp_path / "run"
    run.mkdir()
    config = {**TrainConfig(epochs=1).to_dict(), "warmup_epochs": 3}
    torch.save({"format": "bnn-train-checkpoint", "version": 1, "config": config, "status": "ok", "epoch": 1,
                "history": [], "test": None}, run / "checkpoint.pt")
    assert bnn_train.main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'warmup_epochs'" in err[0] and "checkpoint.pt" in err[0], err


def test_search_resume_refuses_a_journal_setting_it_does_not_know(tmp_path, capsys):
    run = tmp_path / "search"
    run.mkdir()
    config = {**dataclasses.asdict(SearchConfig(fitness="synthetic:0", population=2, max_evaluations=1)),
              "populaton": 4}
    (run / "journal.jsonl").write_text(json.dumps({"type": "start", "version": 1, "time": 0, "config": config}) + "\n")
    assert search_cli.main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'populaton'" in err[0] and "population" in err[0], err


def test_gene_limits_come_from_the_operator_table_and_genome_layout():
    assert (GENES, N_UNARY_SLOTS) == (len(refimpl.Genome.parse("baseline").codes), 4)
    assert list(gene_limits()) == [18, 18, 18, 18, 14, 14, 14]


@pytest.mark.parametrize("seed", [0, 1, 5, 123])
def test_planted_target_draws_as_before(seed):
    # The synthetic fitness's optimum must not move (journals and pinned tests depend on it).
    expected = np.random.Generator(np.random.PCG64([seed, 7])).integers(0, [18] * 4 + [14] * 3)
    assert planted_target(seed) == tuple(int(x) for x in expected)


def test_every_name_bnn_train_had_before_the_split_is_still_there():
    names = ("ADAM_BETAS", "CHECKPOINT", "CUDA_FINITE_CHECK_EVERY", "DEFAULT_MODEL", "DEFAULT_PRESET", "DEVICES",
             "EVAL_BATCH", "METRICS", "PRESETS", "RESUME_FIXED", "RUN_FILES", "STATUSES", "SUMMARY", "TrainConfig",
             "TrainResult", "check_settings", "config_from_args", "evaluate", "finished_result", "load_checkpoint",
             "main", "resolve_device", "run_finished", "train_model", "_parser", "_setup_backend")
    assert [n for n in names if not hasattr(bnn_train, n)] == []
