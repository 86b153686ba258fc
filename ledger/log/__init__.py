"""The transparency log: RFC 6962 Merkle hashes and proofs, C2SP signed notes, its leaves
and rows in the store, its key, the audit of it against the ledger, and the witness."""
