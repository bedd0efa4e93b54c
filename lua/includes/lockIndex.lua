-- The lock index, `<prefix>locks` (ZSET): every id in `active`, scored by the
-- time its lock lapses unless renewed, on Redis's own clock (the clock that
-- expires lock keys). A sweep reads the lapsed ids from it instead of testing
-- every lock key in `active`. Only scripts that move ids into or out of
-- `active`, or renew locks, write it; the key is built from the prefix, so it
-- shares the queue's hash tag (and Cluster slot).
local function redisNowMs()
  local time = redis.call("TIME")
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
