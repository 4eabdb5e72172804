"""What runs in the engine process (LitServe's inference worker): the LitAPI, the engine loop, and the
workers that prepare requests in a thread pool and step the one engine for all of them."""
