"""reward_service."""
