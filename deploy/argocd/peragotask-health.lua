-- Argo CD health check for perago.io/PeragoTask, reading the kstatus conditions the operator
-- keeps: Stalled=True is Degraded, Ready=True (for the current generation) is Healthy,
-- anything else is Progressing.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
local generation = obj.metadata.generation
if obj.status.observedGeneration ~= nil and generation ~= nil and obj.status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end
local ready = nil
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Stalled" and condition.status == "True" then
    hs.status = "Degraded"
    hs.message = condition.message
    return hs
  end
  if condition.type == "Ready" then
    ready = condition
  end
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
hs.status = "Progressing"
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message
else
  hs.message = "Reconciling"
end
return hs
