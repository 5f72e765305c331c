-- promote: set serving.aiinference.io/promote to a new value; the operator acts once
-- per value (status.rollout.lastHandledPromote keeps the last one).
local os = require("os")
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["serving.aiinference.io/promote"] = os.date("!%Y-%m-%dT%H:%M:%SZ")
return obj
