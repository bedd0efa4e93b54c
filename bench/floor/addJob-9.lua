--[[
  The floor of an add (bench/redis_time.py --floor): the least any queue that
  keeps a job as a hash in a ready list can do, called with addJob-9's keys and
  arguments. It keeps no promise of the real script: no pause, delay,
  priority, group, dedupe, expiry, event, or record of a re-sent call.
]]
local prefix, timestamp = ARGV[1], ARGV[2]
local idBase = string.match(prefix, "{([^{}]*)}:$") .. "."
local result, ready = {}, {}
for i = 6, #ARGV, 11 do
  local id = ARGV[i]
  if id == "" then id = idBase .. redis.call("INCR", KEYS[4]) end
  redis.call("HSET", prefix .. id, "name", ARGV[i + 1], "data", ARGV[i + 2], "opts", ARGV[i + 3],
    "timestamp", timestamp)
  ready[#ready + 1] = id
  result[#result + 1] = id
  result[#result + 1] = 1
end
redis.call("LPUSH", KEYS[1], unpack(ready))
redis.call("ZADD", KEYS[6], 0, "0")  -- wakes a blocked worker
return result
