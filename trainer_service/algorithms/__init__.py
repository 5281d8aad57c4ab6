"""The maths of the trainer as pure functions: advantages, the decoupled PPO loss, staleness rules."""
