"""Tests against a real Kubernetes (etcd, API server, controller manager, scheduler, containerd, kubelet)."""
