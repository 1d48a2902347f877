"""Worlds of ranks (world.py, role_worlds.py), the links between roles (role_link.py, role_access.py), and the
rollout fleet of separate placement with the weights streamed to it (rollout_fleet.py, weight_stream.py)."""
