--[[
  extendLocks: renew every lock a worker holds in one call (see extendLock for
  the ownership rule). A worker calls this at half its lock duration.

  KEYS[1] stalled   SET

  ARGV[1] key prefix of the queue
  ARGV[2] lock duration, ms
  ARGV[3], ARGV[4]  job id, token  (repeated for each held job)

  Returns the ids whose lock could not be renewed (ownership lost).
]]
local prefix, lockMs = ARGV[1], ARGV[2]
local lost = {}
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local jobKey = prefix .. id
  if redis.call("HGET", jobKey, "tok") == token then
    redis.call("SET", jobKey .. ":lock", token, "PX", lockMs)
    redis.call("SREM", KEYS[1], id)
  else
    lost[#lost + 1] = id
  end
end
return lost
