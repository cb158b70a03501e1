"""What the runs measured, computed: the scaling table with its intervals (scaling), the accuracy
test over seeds (accuracy), where a step's time goes and its prediction (breakdown), the full
training's projected cost (projection), time to accuracy (timetoacc), cost per sample (cost),
whether the workload is overhead-bound (boundness) and the network the runs crossed (interconnect).
"""
