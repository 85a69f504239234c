"""Deployment at scale (Terraform, images, Kubernetes). Only `k8s` is Python: the manifests'
templates and the one function that renders them (operators and the Kubernetes launcher)."""
