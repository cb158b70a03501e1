"""What the runs cost before they are submitted: each training stage's time limit, whether
throughput mode can win over full training for the configured work, and the devices, hours and
GPU-hours a dry run says the benchmark reserves."""
