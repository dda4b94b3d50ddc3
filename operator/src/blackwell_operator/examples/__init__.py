"""Embedded example manifests (package data)."""
