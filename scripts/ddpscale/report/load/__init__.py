"""The report's inputs: each run's metrics.json read, validated and checked comparable (records),
what the runs trained as the report's head says it (description), and an earlier scaling.tsv to
compare with (earlier), read by the one TSV writer and reader (tsv).
"""
