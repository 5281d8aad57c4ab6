"""trainer_service."""
