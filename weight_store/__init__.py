"""weight_store."""
