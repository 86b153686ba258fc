"""Hallmark's service layer: gateway, engines, provenance ledger, auth and CLI."""
