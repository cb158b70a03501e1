"""The answer a user came for: which topology to use as far as the intervals tell it (decision,
recommendation), the first screen that says so (firstscreen), and where a number cannot mean what
it seems (caveats).
"""
