"""Nezha: a Kubernetes-native cache for the datasets ML training jobs download."""
