"""The control plane: the planner (an RLJob's children, pure), reconcile (ordered policies, pure), the
controller and its caches, and the operator process (manager.py)."""
