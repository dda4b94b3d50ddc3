-- Argo CD health check for training.blackwell.dev/BlackwellTrainingJob.
-- Install under argocd-cm key resource.customizations.health.training.blackwell.dev_BlackwellTrainingJob
-- (examples/argocd/argocd-cm-health.yaml). Reads only status, which the operator writes:
--   Progressing  until the operator has reconciled the current generation, while pending or running
--                (like Argo CD's batch/Job check: a running job has not reached its goal yet; a running
--                job's message leads with its step, percent, time left and measured tokens/s);
--   Degraded     for an invalid spec, a failed job, or a spec change the running job cannot take;
--   Suspended    while Kueue holds the job in its queue (Progressing, saying so, when the spec names a
--                queue and the job runs without Kueue: condition KueueManaged False);
--   Healthy      when the job succeeded, or a dry run has its plan.
local function progressing(message)
  return {status = "Progressing", message = message}
end

if obj.status == nil then
  return progressing("Waiting for the operator")
end

local generation = obj.metadata.generation or 0
local observed = obj.status.observedGeneration or 0
if observed < generation then
  return progressing("Waiting for the operator to reconcile generation " .. generation ..
    " (last reconciled: " .. observed .. ")")
end

local conditions = {}
for _, condition in ipairs(obj.status.conditions or {}) do
  conditions[condition.type] = condition
end
local function is(kind, status)
  return conditions[kind] ~= nil and conditions[kind].status == status
end
local function message(kind, fallback)
  local condition = conditions[kind]
  if condition ~= nil and condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return fallback
end

-- "step 120/1000 (12%), 3h04m left (ETA ...), 21034.5 tokens/s/GPU measured" from status.progress and
-- status.measured (the operator's measure loop); nil before the first reading.
local function progress_text(progress, measured)
  if progress == nil or progress.step == nil or progress.totalSteps == nil then
    return nil
  end
  local text = "step " .. tostring(progress.step) .. "/" .. tostring(progress.totalSteps)
  if progress.percent ~= nil then
    text = text .. " (" .. tostring(progress.percent) .. "%)"
  end
  if progress.remaining ~= nil then
    text = text .. ", " .. progress.remaining .. " left"
    if progress.eta ~= nil then
      text = text .. " (ETA " .. progress.eta .. ")"
    end
  end
  if measured ~= nil and measured.tokensPerSecondPerGpu ~= nil then
    text = text .. ", " .. tostring(measured.tokensPerSecondPerGpu) .. " tokens/s/GPU measured"
  end
  return text
end

local phase = obj.status.phase or ""
if phase == "Invalid" then
  return {status = "Degraded", message = "Invalid spec: " .. message("Planned", "see the Planned condition")}
end
if phase == "Failed" or is("Failed", "True") then
  return {status = "Degraded", message = message("Failed", message("ChildCreated", obj.status.message or "Failed"))}
end
if is("SpecApplied", "False") then
  return {status = "Degraded", message = "Spec not applied: " .. message("SpecApplied", "see the SpecApplied condition")}
end
if phase == "Succeeded" or is("Succeeded", "True") then
  return {status = "Healthy", message = message("Succeeded", "Succeeded")}
end
if phase == "Queued" then
  return {status = "Suspended", message = message("Admitted", "Waiting in the Kueue queue")}
end
if phase == "Planned" then
  return {status = "Healthy", message = "Planned (dry run): " .. message("Planned", "")}
end
if is("KueueManaged", "False") then
  -- The spec names a queue and the job runs outside it: not a failure, but worth seeing in Argo CD.
  return progressing("Not queued by Kueue: " .. message("KueueManaged", ""))
end
if phase == "Restarting" then
  return progressing("Restarting: " .. (obj.status.message or ""))
end
if phase == "Running" then
  local progress = progress_text(obj.status.progress, obj.status.measured)
  if progress ~= nil then
    return progressing("Running: " .. progress .. "; " .. (obj.status.message or ""))
  end
  return progressing(obj.status.message or "Running")
end
if is("CapacityAvailable", "False") then
  return progressing("Pending: " .. message("CapacityAvailable", "not enough nodes"))
end
return progressing(obj.status.message or "Pending")
