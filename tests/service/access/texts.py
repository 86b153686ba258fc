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

OTHER = (
    "Every spring the river flooded the lower meadows, and every spring the farmers moved their sheep "
    "to the ridge and waited. The water came brown and slow, carrying branches, fence posts and once a "
    "rowing boat with no one in it, which the postmaster claimed and painted blue. When it went down it "
    "left a skin of silt that cracked in the sun, and the grass that grew through it was the best in the "
    "valley. The old surveyor kept a notebook of the flood marks on the mill wall, each dated in pencil, "
    "and argued with anyone who would listen that the river was rising a finger's width every decade. "
    "The schoolteacher set her pupils to measure it themselves, with string and a borrowed ladder, and "
    "they found he was right, which pleased him more than anything had in years. On market days the "
    "square smelled of onions and wet wool; the cheese seller sang hymns out of tune, the cobbler mended "
    "boots on an upturned crate, and the mayor walked from stall to stall shaking hands with people who "
    "had not voted for him. In autumn the swallows gathered on the telegraph wires, and the children "
    "counted them every morning until one day the wires were empty and it was time to light the stoves."
)


def variant(text: str, i: int) -> str:
    """``text`` with its ``i``-th word (counting every seventh) replaced: one small edit, the
    kind a probing attacker makes between queries."""
    words = text.split(" ")
    j = (7 * i + 3) % len(words)
    words[j] = f"word{i}"
    return " ".join(words)
