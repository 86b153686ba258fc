"""The provenance ledger: hash-chained generation entries, their k-grams, and the signed
receipts and reports that cite them (the transparency log that holds it all: ``ledger.log``).

Built on the key store (``keys``: tables, sessions, the KEK); the key store never imports it.
"""
