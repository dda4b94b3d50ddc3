"""Test and demo support: a hardened KMock Kubernetes API emulator (needs the `demo` extra)."""
