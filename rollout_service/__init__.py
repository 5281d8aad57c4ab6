"""rollout_service."""
