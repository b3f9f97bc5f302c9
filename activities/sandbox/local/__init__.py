"""The local backend: bubblewrap namespaces, seccomp and rlimits around a workspace on the worker's host."""
