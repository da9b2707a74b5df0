"""Task prompts shaped as Open WebUI's (v0.5-0.6 defaults): one `user` message that begins `### Task:` and quotes
the chat between <chat_history> tags, as its title, tags and follow-up generation send them to the chat's model
(`max_completion_tokens: 1000`, no `metadata` upstream). The wording here is ours; the shape is theirs."""

from __future__ import annotations

TITLE_TASK = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
- Use emojis that enhance understanding of the topic, but avoid quotation marks or special formatting.
- Write the title in the chat's primary language; default to English if multilingual.
### Output:
JSON format: { "title": "your concise title here" }
### Examples:
- { "title": "📦 Parcel At The Door" },
- { "title": "Evening Driveway Visitors" }
### Chat History:
<chat_history>
{history}
</chat_history>"""

FOLLOW_UPS_TASK = """### Task:
Suggest 3-5 relevant follow-up questions or prompts that the user might naturally ask next in this conversation,
based on the chat history, to help continue or deepen the discussion.
### Output:
JSON format: { "follow_ups": ["Question 1?", "Question 2?", "Question 3?"] }
### Chat History:
<chat_history>
{history}
</chat_history>"""

# The length of the title prompt Open WebUI sent for a two-turn chat about the cameras, as the issue measured it.
TITLE_CHARS = 4503


def history(chars: int, first: str = "USER: Was there a courier at the front door this morning?") -> str:
    """Chat turns as Open WebUI quotes them (`USER:` / `ASSISTANT:` lines), `chars` characters long, the oldest
    first; each line numbered, so that what a shortened history kept can be told."""
    lines = [first]
    turn = 0
    while sum(len(line) + 1 for line in lines) < chars:
        turn += 1
        role = "ASSISTANT" if turn % 2 else "USER"
        lines.append(f"{role}: turn {turn}: a courier in a red jacket left a parcel at the front door at 08:12 [1].")
    text = "\n".join(lines)
    return text[:chars]


def title_prompt() -> str:
    """A title prompt of exactly TITLE_CHARS characters."""
    empty = TITLE_TASK.replace("{history}", "")
    prompt = TITLE_TASK.replace("{history}", history(TITLE_CHARS - len(empty)))
    assert len(prompt) == TITLE_CHARS
    return prompt


def follow_ups_prompt(history_chars: int) -> str:
    return FOLLOW_UPS_TASK.replace("{history}", history(history_chars))
