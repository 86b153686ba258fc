"""How evidence is scored: exact statistics over token ids. Pure, no I/O."""
