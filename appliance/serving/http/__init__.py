"""What runs in the HTTP process: the LitSpec of our routes, the middleware, the front end that admits
requests and reads their events, error bodies and the OpenAPI document."""
