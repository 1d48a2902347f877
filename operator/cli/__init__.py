"""The command line: every `kuberl` and `kubectl rl` verb, `kuberl run` on one machine, the smoke check."""
