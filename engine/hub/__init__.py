"""Hub repositories into a job's cache volume, once, before its trainers start: `kuberl initialize` (initializer.py)."""
