"""Checkpoints: finding them (lookup: committed, damaged, the newest intact one), saving and loading them with
their checksums (checkpointer), weights alone (weights), where they are written (storage: room, permissions,
a failed save explained) and the orphan watchdog that stops a dead trainer's save helpers. The trainer, the
evaluators and the converters import this package; it imports none of them."""
