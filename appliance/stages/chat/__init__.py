"""Vision-language chat stages (`pipeline=llava_chat`, docs/chat.md).

vision_inputs -> engine (pool mode: the vision tower) -> features_write (`pipeline=llava_encode`): images ->
vision-tower features files.
chat_requests (a photo + prompt, or an OpenAI batch .jsonl) -> chat_prompt (template, images,
placeholders) -> engine -> chat_responses (answer text, or the batch output file).
"""
from appliance.stages.chat import encode, prompt, requests, responses  # noqa: F401  (register the stages)
