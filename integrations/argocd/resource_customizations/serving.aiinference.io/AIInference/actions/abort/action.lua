-- abort: set serving.aiinference.io/abort to a new value; the operator acts once
-- per value (status.rollout.lastHandledAbort keeps the last one).
local os = require("os")
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["serving.aiinference.io/abort"] = os.date("!%Y-%m-%dT%H:%M:%SZ")
return obj
