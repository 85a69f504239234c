"""Kubernetes resources of the platform as Jinja templates, and their renderer (`render`)."""
