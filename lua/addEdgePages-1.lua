--[[
  addEdgePages: write pages of one workflow step's edges, for a step whose
  end goes to more than WORKFLOW_FAN_EDGES steps (a chain into a large
  group): its `nxt` holds one edge of kind "f" naming them instead, and the
  deliveries read a page a call (includes/workflow.lua). Written before the
  step is added, so they are there whenever it ends; a page written twice is
  the same text, so a re-sent call changes nothing.

  KEYS[1] <id>:nxt  HASH   "n": how many pages; "0", "1", ...: each a JSON list of edges

  ARGV[1] pages  how many pages the step has in all
  ARGV[2] first  the number of the first page this call writes
  then one value per page, ARGV[n+1] with n = 2, 3, 4, ...:
  ARGV[n+1] page  JSON: a list of edges, [prefix, target, slot, kind] each

  Returns the number of pages written.
]]

local fields, first = {"n", ARGV[1]}, tonumber(ARGV[2])
for i = 3, #ARGV, 1 do
  fields[#fields + 1] = tostring(first + i - 3)
  fields[#fields + 1] = ARGV[i]
end
redis.call("HSET", KEYS[1], unpack(fields))
return #ARGV - 2
