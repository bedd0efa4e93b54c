--[[
  The floor of a finish (bench/redis_time.py --floor), called with
  moveToFinished-10's keys and arguments: each attempt checked against its
  token, taken out of `active` and the lock index, completed, and `completed`
  trimmed to its newest jobs. No failures or retries, stalled mark, lock key,
  fetch record, groups, workflows, dedupe, event or metrics.
]]
local prefix, now, keep = ARGV[1], ARGV[2], tonumber(ARGV[5])
local codes, done = {}, 0
for i = 10, #ARGV, 8 do
  local id, token = ARGV[i], ARGV[i + 1]
  local jobKey = prefix .. id
  if redis.call("HGET", jobKey, "tok") ~= token then
    codes[#codes + 1] = -2
  else
    redis.call("LREM", KEYS[1], -1, id)
    redis.call("ZREM", prefix .. "locks", id)
    redis.call("HDEL", jobKey, "tok")
    redis.call("HSET", jobKey, "atm", 1, "finishedOn", now, "returnvalue", ARGV[i + 3])
    redis.call("ZADD", KEYS[2], now, id)
    codes[#codes + 1] = 1
    done = done + 1
  end
end
if done > 0 and keep >= 0 then
  local excess = redis.call("ZCARD", KEYS[2]) - keep
  if excess > 0 then
    local gone, keys = redis.call("ZPOPMIN", KEYS[2], excess), {}
    for j = 1, #gone, 2 do keys[#keys + 1] = prefix .. gone[j] end
    redis.call("DEL", unpack(keys))
  end
end
return codes
