--[[
  The floor of a fetch (bench/redis_time.py --floor), called with
  moveToActive-10's keys and arguments and answering in its reply's shape:
  each job moved to `active`, locked by one entry in the lock index, its
  attempt marked in its hash, the hash returned. No delayed jobs promoted, no
  pause, flow control, groups, lock key, fetch record, event or metrics.
]]
local prefix, token, lockMs, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])
local now = tonumber(ARGV[4]) or tonumber(redis.call("TIME")[1]) * 1000
local result, taken = {false, 0, {}, 1}, 0
while taken < limit do
  local id = redis.call("LMOVE", KEYS[1], KEYS[2], "RIGHT", "LEFT")
  if not id then break end
  local jobKey = prefix .. id
  redis.call("ZADD", prefix .. "locks", now + lockMs, id)
  redis.call("HSET", jobKey, "tok", token, "ats", 1, "processedOn", now)
  result[#result + 1] = id
  result[#result + 1] = redis.call("HGETALL", jobKey)
  taken = taken + 1
end
if taken == limit and redis.call("LLEN", KEYS[1]) > 0 then
  redis.call("ZADD", KEYS[5], 0, "0")  -- work remains: wake another worker
else
  result[4] = 0
end
return result
