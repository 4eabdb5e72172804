// The page of a pipeline that has none of its own yet: the status strip only.

import { byId } from "./dom.js";
import { startStatus } from "./status.js";

startStatus(byId("status"));
