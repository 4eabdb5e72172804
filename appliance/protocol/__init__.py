"""Wire formats the appliance speaks, as pure functions over plain values: OpenAI chat completions and
completions (`openai_requests`, `openai_responses`) and vLLM's `/pooling` body for GeoTIFF models
(`pooling`). The offline verb and the server share them."""
