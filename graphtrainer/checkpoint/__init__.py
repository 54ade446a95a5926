"""Checkpoints: what one holds and resuming from it, the atomic digest-checked file, and run
folders."""
