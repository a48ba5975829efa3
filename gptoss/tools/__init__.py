"""Checkpoint tooling for the gptoss engine (random checkpoints in the released HF layout)."""
