-- pause: hold the canary at its current step while
-- serving.aiinference.io/paused is "true".
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["serving.aiinference.io/paused"] = "true"
return obj
