--[[
  getCounts: the number of jobs in each state, read in one atomic step so the
  numbers are consistent with each other.

  KEYS[1] wait         LIST
  KEYS[2] prioritized  ZSET
  KEYS[3] paused       LIST
  KEYS[4] active       LIST
  KEYS[5] stalled      SET   (marked jobs; they are also counted in active)
  KEYS[6] delayed      ZSET
  KEYS[7] deferred     ZSET  (a workflow's steps waiting for their inputs)
  KEYS[8] parked       ZSET  (durable jobs waiting for a signal: includes/parked.lua)
  KEYS[9] completed    ZSET
  KEYS[10] failed      ZSET
  KEYS[11] meta        HASH  (`groupWaiting`: the jobs waiting in groups' lists)

  then one value per key of KEYS[1] to KEYS[10], ARGV[n+1] with n = 0, 1, 2, ...:
  ARGV[n+1] command  how to count it: LLEN (a list), ZCARD (a sorted set) or SCARD (a set)

  The caller (Scripts.get_counts) names the keys and their commands from one
  list of states, core/protocol/keys.py's COUNTED, so the two cannot drift apart.

  Returns the ten counts, in KEYS order, then the jobs waiting in groups'
  lists (includes/groups.lua), which the caller counts as waiting.
  Errors: "ERR echomq wrong type ..." naming the first key that holds another
  Redis type than the protocol's.
]]
local known = {LLEN = true, ZCARD = true, SCARD = true}
local counts = {}
for i, command in ipairs(ARGV) do
  if not known[command] then
    return redis.error_reply("ERR echomq getCounts cannot count with " .. tostring(command))
  end
  local count = redis.pcall(command, KEYS[i])
  if type(count) ~= "number" then
    return redis.error_reply("ERR echomq wrong type: " .. KEYS[i] .. " holds a " ..
      redis.call("TYPE", KEYS[i])["ok"] .. ", which " .. command .. " cannot count")
  end
  counts[i] = count
end
local grouped = redis.pcall("HGET", KEYS[11], "groupWaiting")
counts[#counts + 1] = math.max(0, tonumber(type(grouped) == "string" and grouped or "") or 0)
return counts
