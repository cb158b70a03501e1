"""The device a run trains on: the GPU it must have and its memory and utilisation, the FLOPs a
step does against the device's peak, torch.compile as a run setting, and the transport its
collectives use."""
