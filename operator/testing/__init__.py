"""Test support that ships with kuberl: a real local Kubernetes control plane (control_plane.py)."""
