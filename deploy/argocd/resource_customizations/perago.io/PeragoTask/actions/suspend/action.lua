-- Suspend the task: the operator stops its executor pods once they have reported the attempts
-- they run; the TaskDef stays registered and the queue waits.
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.suspend = true
return obj
