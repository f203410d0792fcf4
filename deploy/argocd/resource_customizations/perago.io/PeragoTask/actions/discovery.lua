-- Argo CD resource actions of a PeragoTask: suspend a running task, resume a suspended one
-- (spec.suspend). Both are listed; the one that does not apply is disabled.
local suspended = obj.spec ~= nil and obj.spec.suspend == true
local actions = {}
actions["suspend"] = {["displayName"] = "Suspend", ["iconClass"] = "fa fa-fw fa-pause", ["disabled"] = suspended}
actions["resume"] = {["displayName"] = "Resume", ["iconClass"] = "fa fa-fw fa-play", ["disabled"] = not suspended}
return actions
