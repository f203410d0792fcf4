-- Argo CD health check for perago.io/PeragoTask. Argo CD runs it on gopher-lua (Lua 5.1)
-- without Lua's open libraries, so it uses the base library alone. It reads the kstatus
-- conditions the operator keeps (Ready, Reconciling, Stalled) and spec.suspend:
--
--   being deleted                                   Progressing
--   no status yet, or a generation not observed     Progressing (Suspending or Resuming when
--                                                   that change is what waits)
--   a canary paused by its analysis                 Suspended, with Stalled's message (it
--   (Stalled=True, reason RolloutPaused)            waits for kubectl perago rollout)
--   Stalled=True                                    Degraded, with Stalled's message
--   Ready=True for RolledBack or RolloutAborted     Degraded, with Ready's message: the
--                                                   task works, on the old template, and the
--                                                   template in git does not run
--   Ready for Suspended, Reconciling=False          Suspended, with Ready's message (the
--                                                   operator says Ready=True once the pods
--                                                   are gone: ADR 0035)
--   Ready=True                                      Healthy, with Ready's message
--   anything else (rolling out, pods not ready,     Progressing, with Ready's message
--   Conductor unavailable, a suspension draining)
local hs = {}

local function progressing(message)
  hs.status = "Progressing"
  hs.message = message
  return hs
end

if obj.metadata.deletionTimestamp ~= nil then
  return progressing("Pending deletion: the operator applies the deletionPolicy to the TaskDef")
end

local status = obj.status
if status == nil or status.conditions == nil then
  return progressing("Waiting for the operator to report status")
end

local conditions = {}
for _, condition in ipairs(status.conditions) do
  conditions[condition.type] = condition
end
local ready = conditions["Ready"]
local reconciling = conditions["Reconciling"]
local stalled = conditions["Stalled"]
local suspendedByOperator = ready ~= nil and ready.reason == "Suspended"

local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  local suspend = obj.spec ~= nil and obj.spec.suspend == true
  local waiting = "the operator to observe generation " .. generation
  if suspend and not suspendedByOperator then
    return progressing("Suspending: waiting for " .. waiting)
  end
  if suspendedByOperator and not suspend then
    return progressing("Resuming: waiting for " .. waiting)
  end
  return progressing("Waiting for " .. waiting)
end

if stalled ~= nil and stalled.status == "True" and stalled.reason == "RolloutPaused" then
  hs.status = "Suspended"
  hs.message = stalled.message
  return hs
end

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.message
  if hs.message == nil or hs.message == "" then
    hs.message = stalled.reason
  end
  return hs
end

local message = nil
if ready ~= nil and ready.message ~= nil and ready.message ~= "" then
  message = ready.message
end
if suspendedByOperator and not (reconciling ~= nil and reconciling.status == "True") then
  hs.status = "Suspended"
  hs.message = message or "Suspended"
  return hs
end
if ready ~= nil and ready.status == "True" and (ready.reason == "RolledBack" or ready.reason == "RolloutAborted") then
  hs.status = "Degraded"
  hs.message = message or ready.reason
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = message or "Ready"
  return hs
end
return progressing(message or "Waiting for the operator to report the Ready condition")
