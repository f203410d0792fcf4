-- Resume the task: the operator brings its executor pods back. spec.suspend is set to false
-- rather than removed, so that a manifest in Git that says `suspend: false` stays in sync.
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.suspend = false
return obj
