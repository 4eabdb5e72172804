"""Vision-language chat stages (`pipeline=llava_chat`, docs/chat.md).

chat_requests (a photo + prompt, or an OpenAI batch .jsonl) -> chat_prompt (template, images,
placeholders) -> engine -> chat_responses (answer text, or the batch output file).
"""
from appliance.stages.chat import prompt, requests, responses  # noqa: F401  (register the stages)
