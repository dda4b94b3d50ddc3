-- Provisional Argo CD health check for BlackwellTrainingJob; replaced by a copy of
-- examples/argocd/btj-health.lua (tests/helm checks the two are equal once that file exists).
local hs = {status = "Progressing", message = "Waiting for the operator"}
if obj.status == nil then
  return hs
end
if (obj.status.observedGeneration or 0) < (obj.metadata.generation or 0) then
  hs.message = "Spec change not yet reconciled"
  return hs
end
local conditions = {}
for _, c in ipairs(obj.status.conditions or {}) do
  conditions[c.type] = c
end
local function isTrue(t)
  return conditions[t] ~= nil and conditions[t].status == "True"
end
if obj.status.phase == "Invalid" then
  return {status = "Degraded", message = "Invalid spec"}
end
if isTrue("Failed") then
  return {status = "Degraded", message = conditions.Failed.message or "Failed"}
end
if isTrue("Succeeded") then
  return {status = "Healthy", message = conditions.Succeeded.message or "Succeeded"}
end
if isTrue("Suspended") then
  return {status = "Suspended", message = conditions.Suspended.message or "Queued"}
end
if isTrue("Running") then
  hs.message = conditions.Running.message or "Running"
end
return hs
