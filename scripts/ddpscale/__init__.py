"""ddpscale: measure how PyTorch Lightning DDP training scales from one device to many.

Keep this file free of heavy imports: the Snakefile imports ddpscale.run.topology and
ddpscale.plan.site.resources while parsing, and a dry run must stay fast.
"""

__version__ = "0.1.0"
