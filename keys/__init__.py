"""The key store: tenants, encrypted watermark keys, lifecycle, tokens, ledger, audit."""
