-- Health of an AIInference (serving.aiinference.io/v1), read from the status
-- the operator writes: status.observedGeneration, the kstatus conditions Ready,
-- Reconciling and Stalled, status.phase and, for a canary, status.rollout.
-- It uses only the base and table libraries, so it runs in argocd-cm's
-- sandbox (resource.customizations.useOpenLibs unset) as it does built in.
local hs = {}

local function condition(status, condType)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == condType then
      return c
    end
  end
  return nil
end

local function generationOf(value)
  if value == nil then
    return nil
  end
  return tonumber(value)
end

-- The operator has not seen the object yet: a new object reads
-- status.observedGeneration -1 (the CRD's default), or has no status at all
-- under a CRD from before that default. It is never Healthy.
local observed = nil
if obj.status ~= nil then
  observed = generationOf(obj.status.observedGeneration)
end
if obj.status == nil or (observed ~= nil and observed < 0) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the AIInference"
  return hs
end

-- A status computed for an earlier spec says nothing of this one.
local generation = generationOf(obj.metadata.generation)
if observed == nil or (generation ~= nil and observed ~= generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation) ..
    " (status is of generation " .. tostring(observed) .. ")"
  return hs
end
local ready = condition(obj.status, "Ready")
if ready == nil or (ready.observedGeneration ~= nil and generation ~= nil and generationOf(ready.observedGeneration) ~= generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report the Ready condition of generation " .. tostring(generation)
  return hs
end
local message = ready.message or ""

-- A canary that waits for a person without anything being wrong: paused by
-- hand (serving.aiinference.io/paused), at a pause step without a duration,
-- or with analyses that could not judge it (AnalysisInconclusive: the stable
-- pods serve; promote or abort). Suspended, as Argo CD shows a paused Rollout.
local rollout = obj.status.rollout
if rollout ~= nil and (rollout.phase == "Paused" or rollout.phase == "Inconclusive") then
  hs.status = "Suspended"
  hs.message = message
  return hs
end
if ready.reason == "CanaryPaused" or ready.reason == "AnalysisInconclusive" then
  hs.status = "Suspended"
  hs.message = message
  return hs
end

-- Stalled (kstatus): no progress without a person: a missing reference, loads
-- stopped, a canary rolled back, no progress within the deadline.
local stalled = condition(obj.status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.message or message
  return hs
end
if obj.status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = message
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = message
  return hs
end

-- Ready is False or Unknown and the operator is still at work (Reconciling):
-- pods pending or loading, the engine warming up, a rollout or canary step.
hs.status = "Progressing"
hs.message = message
return hs
