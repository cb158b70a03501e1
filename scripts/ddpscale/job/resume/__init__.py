"""How a run stops and resumes: the checkpoint it saves every epoch and the one it resumes from,
each signed with its checksum, and the signals that stop every rank at one step with a
checkpoint to resume."""
