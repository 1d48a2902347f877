"""One rank's life: the run composed from its configuration (builders.py), the RL loop (rl.py), the roles'
workers, checkpoints, progress for the operator, metrics, graceful stopping; worker.py is `kuberl worker`."""
