// The API docs page: this server's OpenAPI document rendered by Swagger UI (vendor/), which the page
// loads before this module. URLs are relative to the page, so the page works behind a proxy's prefix;
// the document's `servers` entry ("." from openapi.json) sends "Try it out" to this same server.

window.SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#docs",
  persistAuthorization: true, // the API key given in Authorize is kept across reloads (localStorage)
  validatorUrl: null, // no badge from swagger.io: the page reaches no other origin
});
