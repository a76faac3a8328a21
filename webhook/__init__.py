"""Admission webhook: points training pods at the cache with hostAliases."""
