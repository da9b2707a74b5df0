"""A chat UI's own task prompts: not questions about the captions, but chat the VLM answers as it is.

Open WebUI (and UIs built like it) send the model they chat with extra requests of their own: a title for the
chat, tags, follow-up questions, search queries, autocompletion. Each is one `user` message that begins
`### Task:` and quotes the conversation between `<chat_history>` and `</chat_history>`, thousands of characters
long. Read as a question, its words would retrieve captions and its length would exceed the question's bound; it
goes to the VLM as plain chat instead, without captions, its quoted history shortened from the oldest end when
the whole does not fit the model's context (the newest turns say most about what a title or a follow-up needs).
"""

from __future__ import annotations

from visioncap.ask.prompt import MESSAGE_TOKENS, TEMPLATE_TOKENS, Prompt, estimate_tokens

TASK_START = "### Task:"
HISTORY_OPEN = "<chat_history>"
HISTORY_CLOSE = "</chat_history>"
SHORTENED = "[earlier turns left out]\n"


class TaskTooLong(ValueError):
    """The task prompt does not fit the model's context even with its quoted history left out."""


def is_task(text: str) -> bool:
    """Whether the message is a chat UI's task prompt rather than a question."""
    return text.lstrip().startswith(TASK_START)


def _fits(text: str, budget: int) -> bool:
    return estimate_tokens(text) <= budget


def shorten_history(text: str, budget_tokens: int) -> str:
    """`text` within `budget_tokens` as estimated: unchanged when it fits, else with the start of its quoted chat
    history cut at a line boundary. TaskTooLong when the rest of it alone does not fit."""
    if _fits(text, budget_tokens):
        return text
    start = text.find(HISTORY_OPEN)
    end = text.find(HISTORY_CLOSE, start + len(HISTORY_OPEN)) if start >= 0 else -1
    if end < 0:
        raise TaskTooLong(
            f"the task prompt takes about {estimate_tokens(text)} tokens, more than the {budget_tokens} the "
            "model's context leaves, and quotes no <chat_history> to shorten"
        )
    head, history, tail = text[: start + len(HISTORY_OPEN)], text[start + len(HISTORY_OPEN) : end], text[end:]
    # Bytes the history may keep: estimate_tokens counts UTF-8 bytes / 2 (plus one).
    room = (budget_tokens - 1) * 2 - len((head + "\n" + SHORTENED + tail).encode())
    if room < 0:
        raise TaskTooLong(
            f"the task prompt takes about {estimate_tokens(head + tail)} tokens without its chat history, more "
            f"than the {budget_tokens} the model's context leaves"
        )
    kept = history.encode()[-room:].decode(errors="ignore") if room else ""
    newline = kept.find("\n")
    kept = kept[newline + 1 :] if newline >= 0 else ""  # from a whole line on
    shortened = f"{head}\n{SHORTENED}{kept}{tail}"
    assert _fits(shortened, budget_tokens)
    return shortened


def task_prompt(text: str, budget_tokens: int) -> Prompt:
    """The task as the one message of a plain chat, within `budget_tokens` (the context less the answer's)."""
    budget = budget_tokens - TEMPLATE_TOKENS - MESSAGE_TOKENS
    if budget < 1:
        raise TaskTooLong(f"the model's context leaves no room for a task prompt ({budget_tokens} tokens)")
    content = shorten_history(text, budget)
    spent = estimate_tokens(content) + TEMPLATE_TOKENS + MESSAGE_TOKENS
    return Prompt([{"role": "user", "content": content}], [], spent)
