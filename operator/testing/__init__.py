"""The tests' harness: a real local Kubernetes control plane (control_plane.py), a real node (node.py), and the
stand-ins for what cannot run here. Not shipped: the wheel and the images leave this folder out."""
