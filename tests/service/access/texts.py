"""Texts for the access-tier tests: a human paragraph of more than 200 tokens, and variants."""

HUMAN = (
    "The harbour town woke slowly that winter. Fishermen who had spent the night mending nets walked up "
    "the cobbled lanes with their hands deep in their pockets, and the baker on the corner lifted his "
    "shutters a little after six, as he had done for thirty years. Nobody remembered when the ferry had "
    "last kept to its timetable; the captain blamed the tides, the tides were blamed on the moon, and "
    "the moon, as far as anyone could tell, did not care. Children raced to the school gate with their "
    "satchels bouncing, stopping only to throw stones at the gulls that waited on the sea wall for "
    "scraps. In the library the old clock ticked beside a shelf of local histories that no one had "
    "opened since the flood, and the librarian, a patient woman with ink on her fingers, catalogued "
    "letters donated by a family who had emigrated a century before. Their handwriting sloped to the "
    "right and spoke of storms, of debts, of a brother who never wrote back. By noon the fog lifted and "
    "the hills behind the town turned green and then gold, and the church bell rang twelve times, a "
    "little late, because the sexton had stopped to talk about the football. In the evening the pub "
    "filled with the same voices it always held, arguing about the price of diesel, the new road that "
    "would never be built, and whether the lighthouse keeper's dog was really fourteen years old."
)


def variant(text: str, i: int) -> str:
    """``text`` with its ``i``-th word (counting every seventh) replaced: one small edit, the
    kind a probing attacker makes between queries."""
    words = text.split(" ")
    j = (7 * i + 3) % len(words)
    words[j] = f"word{i}"
    return " ".join(words)
