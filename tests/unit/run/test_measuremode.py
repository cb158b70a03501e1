"""config measure and accuracy.epoch_metric, resolved as the workflow resolves them."""
import pytest

from ddpscale.run import measuremode


def test_auto_measures_throughput_on_a_cluster_and_the_full_training_locally():
    assert measuremode.resolve("auto", site_is_local=False)[0] == "throughput"
    assert measuremode.resolve("auto", site_is_local=True)[0] == "full"
    mode, why = measuremode.resolve("auto", site_is_local=False)
    assert "measure: full" in why  # the one setting away is named


def test_auto_trains_in_full_on_a_cluster_where_throughput_mode_cannot_win():
    why_not = "throughput mode cannot reach its precision inside the configured training"
    mode, why = measuremode.resolve("auto", site_is_local=False, cannot_win=why_not)
    assert mode == "full" and why_not in why
    assert measuremode.resolve("auto", site_is_local=True, cannot_win=why_not)[0] == "full"


@pytest.mark.parametrize("setting", ["throughput", "full"])
def test_an_explicit_setting_wins_everywhere(setting):
    assert measuremode.resolve(setting, site_is_local=True)[0] == setting
    assert measuremode.resolve(setting, site_is_local=False)[0] == setting
    # asked for by name, throughput mode runs even where it cannot win (its line says so)
    assert measuremode.resolve(setting, site_is_local=False, cannot_win="it cannot")[0] == setting


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="auto, throughput or full"):
        measuremode.resolve("fast", site_is_local=True)


@pytest.mark.parametrize("metric,setting,expected", [
    ("test_acc", "auto", "val_acc"), ("test/loss", "auto", "val/loss"), ("val_loss", "auto", "val_loss"),
    ("test_acc", "valid/accuracy", "valid/accuracy"),
])
def test_the_epoch_metric(metric, setting, expected):
    assert measuremode.epoch_metric(metric, setting) == expected


def test_auto_repeats_show_placement_noise_where_runs_are_cheap():
    assert measuremode.repeats("auto", "throughput") == 3
    assert measuremode.repeats("auto", "full") == 1
    assert measuremode.repeats(2, "throughput") == 2 == measuremode.repeats(2, "full")
