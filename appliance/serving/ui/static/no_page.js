// The page of a pipeline that has none of its own yet: the status strip only. The page has no use for
// the API key and never asks for it; its one API request (/v1/models) starts the strip where the server
// needs no key (a pipeline without /v1/models answers it 404, which still says the key check passed).

import { makeClient } from "./api.js";
import { byId } from "./dom.js";
import { startStatus } from "./status.js";

const client = makeClient(async () => null);
startStatus(byId("status"), client);
client.request("v1/models").catch(() => {}); // a 401 or 404 here is the answer, not a fault
