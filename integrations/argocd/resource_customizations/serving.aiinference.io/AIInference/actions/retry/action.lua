-- retry: set serving.aiinference.io/requestedAt to a new value; the operator
-- reconciles at once, grants stopped loads a fresh retry budget and tries a
-- rolled-back canary again (status.lastHandledRequestedAt keeps the value).
local os = require("os")
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["serving.aiinference.io/requestedAt"] = os.date("!%Y-%m-%dT%H:%M:%SZ")
return obj
