"""What runs in the engine process (LitServe's inference worker): the LitAPI, the engine loop, and the
drivers whose preparer threads prepare requests, and that step the one engine for all of them."""
