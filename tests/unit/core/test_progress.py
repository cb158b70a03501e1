"""The progress line rank 0 writes per epoch is the line `make status` reads."""

from ddpscale.core.record import Progress, last_progress, progress_line


def test_progress_line_reads_back_as_written():
    written = Progress(epoch=3, max_epochs=12, epoch_s=4.25, throughput=1834.5, attempt=2,
                                fit_s=13.1, at=1795465407.8)
    log = "ddpscale: topology 1x2 ...\n" + progress_line(written) + "\nTrainer.fit stopped\n"
    assert last_progress(log) == written


def test_the_last_of_several_lines_counts_and_none_before_the_first_epoch():
    lines = [progress_line(Progress(k, 5, 1.0, 100.0, 1, float(k), 1e9 + k)) for k in (1, 2)]
    assert last_progress("\n".join(lines)).epoch == 2
    assert last_progress("ddpscale probe: 1x2 world size 2 ...\n") is None
