"""The key store: tenants, encrypted watermark keys, lifecycle, tokens, the KEK, audit (the
ledger and its transparency log are the `ledger` package, which builds on this one)."""
