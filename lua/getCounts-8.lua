--[[
  getCounts: the number of jobs in each state, read in one atomic step so the
  numbers are consistent with each other.

  KEYS[1] wait       LIST
  KEYS[2] paused     LIST
  KEYS[3] active     LIST
  KEYS[4] delayed    ZSET
  KEYS[5] completed  ZSET
  KEYS[6] failed     ZSET
  KEYS[7] stalled    SET   (marked jobs; they are also counted in active)
  KEYS[8] prioritized ZSET

  Returns {wait, paused, active, delayed, completed, failed, stalled, prioritized}.
  Errors: "ERR echomq wrong type ..." naming the first key that holds another
  Redis type than the protocol's.
]]
local counters = {"LLEN", "LLEN", "LLEN", "ZCARD", "ZCARD", "ZCARD", "SCARD", "ZCARD"}
local counts = {}
for i, command in ipairs(counters) do
  local count = redis.pcall(command, KEYS[i])
  if type(count) ~= "number" then
    return redis.error_reply("ERR echomq wrong type: " .. KEYS[i] .. " holds a " ..
      redis.call("TYPE", KEYS[i])["ok"] .. ", which " .. command .. " cannot count")
  end
  counts[i] = count
end
return counts
