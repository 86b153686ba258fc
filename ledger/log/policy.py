"""Transparency-log trust policies (c2sp.org/tlog-policy): which logs, which witnesses, and
the quorum of cosignatures a checkpoint needs. Pure functions, no I/O.

::

    log <vkey> [<url>]
    witness <name> <vkey> [<url>]
    group <name> all|any|<k> <name>...
    quorum <name>|none

Names are defined before use (so groups cannot be circular), each member at most once in a
group, exactly one quorum line. The gateway reads its witnesses' URLs from it (tlog-witness
submission prefixes); an offline verifier (`hallmark receipt verify --policy`) needs only
keys. A checkpoint is valid under the policy when one listed log signed it and the quorum
cosigned it (:func:`Policy.verify`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ledger.log.cosignature import CosignerKey, cosigned_by
from ledger.log.note import Checkpoint, NoteError, Verifier, open_checkpoint

MAX_ENTRIES = 64
_WHITESPACE = re.compile(r"[ \t]+")


class PolicyError(ValueError):
    """A policy file does not parse, or a checkpoint does not satisfy it; one-line reason."""


@dataclass(frozen=True)
class Witness:
    name: str
    key: CosignerKey
    url: str | None = None


@dataclass(frozen=True)
class Group:
    name: str
    threshold: int
    members: tuple[str, ...]


@dataclass
class Policy:
    logs: list[tuple[Verifier, str | None]] = field(default_factory=list)
    witnesses: dict[str, Witness] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    quorum: str = "none"

    @property
    def witnessed(self) -> bool:
        return self.quorum != "none"

    def satisfied(self, cosigned: set[str], name: str | None = None) -> bool:
        """Whether the witnesses named in ``cosigned`` meet the quorum (or group ``name``)."""
        name = self.quorum if name is None else name
        if name == "none":
            return True
        if name in self.witnesses:
            return name in cosigned
        group = self.groups[name]
        return sum(self.satisfied(cosigned, member) for member in group.members) >= group.threshold

    def cosigners(self, note: str) -> dict[str, int]:
        """The policy's witnesses (by policy name) with a good cosignature on ``note``."""
        found = cosigned_by(note, [w.key for w in self.witnesses.values()])
        return {w.name: found[w.key] for w in self.witnesses.values() if w.key in found}

    def verify(self, note: str) -> tuple[Checkpoint, Verifier, dict[str, int]]:
        """The checkpoint, the log that signed it and the witnesses that cosigned it;
        :class:`PolicyError` unless a listed log signed it and the quorum cosigned it."""
        if not self.logs:
            raise PolicyError("the policy lists no log")
        reasons = []
        for log_key, _ in self.logs:
            try:
                checkpoint = open_checkpoint(note, log_key)
            except NoteError as exc:
                reasons.append(str(exc))
                continue
            cosigned = self.cosigners(note)
            if not self.satisfied(set(cosigned)):
                got = ", ".join(sorted(cosigned)) or "none"
                raise PolicyError(f"the checkpoint (size {checkpoint.size}) lacks the policy's witness quorum "
                                  f"'{self.quorum}' (good cosignatures from: {got})")
            return checkpoint, log_key, cosigned
        raise PolicyError("the checkpoint is not signed by a log the policy lists: " + "; ".join(reasons))


def parse(text: str) -> Policy:
    """A policy from its file's text; :class:`PolicyError` naming the line otherwise."""
    policy = Policy()
    names: set[str] = {"none"}
    quorum_lines = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t")
        if not line or line.startswith("#"):
            continue
        if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in line):
            raise PolicyError(f"policy line {number}: a control character")
        words = _WHITESPACE.split(line)
        try:
            quorum_lines += _line(policy, names, words)
        except (PolicyError, NoteError) as exc:
            raise PolicyError(f"policy line {number}: {exc}") from None
        if len(policy.logs) + len(policy.witnesses) + len(policy.groups) > MAX_ENTRIES:
            raise PolicyError(f"the policy has more than {MAX_ENTRIES} logs, witnesses and groups")
    if quorum_lines != 1:
        raise PolicyError("a policy has exactly one quorum line")
    return policy


def _line(policy: Policy, names: set[str], words: list[str]) -> int:
    keyword, args = words[0], words[1:]
    if keyword == "log":
        if not 1 <= len(args) <= 2:
            raise PolicyError("log <vkey> [<url>]")
        key = Verifier.parse(args[0])
        if any(k.public_raw == key.public_raw for k, _ in policy.logs):
            raise PolicyError("a log is listed twice")
        policy.logs.append((key, args[1] if len(args) == 2 else None))
        return 0
    if keyword == "witness":
        if not 2 <= len(args) <= 3:
            raise PolicyError("witness <name> <vkey> [<url>]")
        _new_name(names, args[0])
        key = CosignerKey.parse(args[1])
        if any(w.key.public_raw == key.public_raw for w in policy.witnesses.values()):
            raise PolicyError("a witness key is listed twice")
        policy.witnesses[args[0]] = Witness(args[0], key, args[2] if len(args) == 3 else None)
        return 0
    if keyword == "group":
        if len(args) < 3:
            raise PolicyError("group <name> all|any|<k> <name>...")
        name, rule, members = args[0], args[1], tuple(args[2:])
        _new_name(names, name)
        if len(set(members)) != len(members):
            raise PolicyError("a group lists a member twice")
        for member in members:
            if member == "none" or (member not in policy.witnesses and member not in policy.groups):
                raise PolicyError(f"group member {member!r} is not a witness or group defined above")
        threshold = {"all": len(members), "any": 1}.get(rule)
        if threshold is None:
            if not re.fullmatch(r"[1-9][0-9]*", rule) or int(rule) > len(members):
                raise PolicyError("a group's threshold is all, any or 1 to its number of members")
            threshold = int(rule)
        policy.groups[name] = Group(name, threshold, members)
        return 0
    if keyword == "quorum":
        if len(args) != 1:
            raise PolicyError("quorum <name>")
        if args[0] != "none" and args[0] not in policy.witnesses and args[0] not in policy.groups:
            raise PolicyError(f"the quorum {args[0]!r} is not a witness or group defined above")
        policy.quorum = args[0]
        return 1
    raise PolicyError(f"unknown keyword {keyword!r} (log, witness, group, quorum)")


def _new_name(names: set[str], name: str) -> None:
    if name in names:
        raise PolicyError(f"the name {name!r} is defined twice (or is 'none')")
    names.add(name)
