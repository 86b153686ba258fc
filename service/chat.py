"""Chat messages to prompt token ids: the tokenizer's chat template when it has one, else
a plain transcript ("role: content" lines, then "assistant:") that small models follow."""

from __future__ import annotations


def chat_prompt_ids(tokenizer, messages: list[tuple[str, str]]) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    transcript = "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"
    return list(tokenizer.encode(transcript))
