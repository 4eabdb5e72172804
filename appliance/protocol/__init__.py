"""Wire formats the appliance speaks, pure (no serving imports): OpenAI chat completions and completions
(`openai_models`, the pydantic request models that validate bodies and are their OpenAPI schemas;
`openai_requests`, a body -> `GenerateRequest`; `openai_responses`, the answers as plain dicts;
`openai_answers`, the pydantic models that describe them) and vLLM's `/pooling`, `/tokenize` and
`/detokenize` bodies and answers (`pooling`, `tokenize`). The offline verb and the server share them;
`validation` turns a model's error into an `InputError` naming the field."""
