"""The site a benchmark runs on, as its profile describes it: the profile's resources and retries
checked, the site facts turned into each job's SLURM resources and launch, the SLURM executor
plugin's job states, and the scheduler's queue that guards against a second job of one run."""
