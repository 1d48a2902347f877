"""Rollout: generating responses with the current policy."""
