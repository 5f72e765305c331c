-- resume: remove serving.aiinference.io/paused. An annotations table left
-- empty is removed: Argo CD would restore an empty table as the old map.
if obj.metadata.annotations ~= nil then
  obj.metadata.annotations["serving.aiinference.io/paused"] = nil
  if next(obj.metadata.annotations) == nil then
    obj.metadata.annotations = nil
  end
end
return obj
