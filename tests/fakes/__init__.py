"""Fakes for the seams ARCHITECTURE.md lists (Kubernetes API server, ...); tests and benchmarks only."""
