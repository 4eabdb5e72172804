"""The pages `appliance serve` answers for people: `GET /` (the page for the pipeline's kind) and `GET /docs`
(the OpenAPI document, rendered offline). Static files in `static/`, plain ES modules and two stylesheets,
no build step (docs/serving.md, "The page")."""
