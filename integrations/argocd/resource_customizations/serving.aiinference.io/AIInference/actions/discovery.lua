-- Actions on an AIInference (serving.aiinference.io/v1). Each sets an
-- annotation the operator reads (api/v1: AnnotationPromote, AnnotationAbort,
-- AnnotationPaused, AnnotationRequestedAt); an action is enabled only where
-- the operator acts on it, so that none is taken and silently dropped.
local actions = {}
local annotations = obj.metadata.annotations or {}
local status = obj.status or {}
local rollout = status.rollout or {}
local phase = rollout.phase

local pausedByHand = annotations["serving.aiinference.io/paused"] == "true"
local canaryRuns = phase == "Progressing" or phase == "Paused" or phase == "Inconclusive"

local stalledReason = nil
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Stalled" and c.status == "True" then
      stalledReason = c.reason
    end
  end
end

-- promote ends the current step; the operator reads it once the step has
-- started (the canary's pods are ready) and not while the rollout is paused.
local promotable = (phase == "Progressing" and rollout.stepStartedAt ~= nil) or phase == "Inconclusive"
actions["promote"] = {
  ["disabled"] = not (promotable and not pausedByHand),
  ["displayName"] = "Promote the canary's current step",
  ["iconClass"] = "fa fa-fw fa-forward"
}
-- abort rolls a running canary back, paused or not.
actions["abort"] = {
  ["disabled"] = not canaryRuns,
  ["displayName"] = "Abort the canary (roll back)",
  ["iconClass"] = "fa fa-fw fa-undo"
}
-- pause holds a canary that is moving; resume lets it go on.
actions["pause"] = {
  ["disabled"] = not (phase == "Progressing" and not pausedByHand),
  ["displayName"] = "Pause the canary",
  ["iconClass"] = "fa fa-fw fa-pause-circle"
}
actions["resume"] = {
  ["disabled"] = not pausedByHand,
  ["displayName"] = "Resume the canary",
  ["iconClass"] = "fa fa-fw fa-play-circle"
}
-- retry (requestedAt) grants stopped loads a fresh budget and tries a
-- rolled-back canary again; an inconclusive canary waits for promote or abort.
local stuck = status.phase == "Failed" or status.phase == "Degraded" or phase == "RolledBack" or
  (stalledReason ~= nil and stalledReason ~= "AnalysisInconclusive")
actions["retry"] = {
  ["disabled"] = not stuck,
  ["displayName"] = "Retry (fresh load budget, or the canary again)",
  ["iconClass"] = "fa fa-fw fa-redo"
}
return actions
