-- @include "constants"
-- @include "callInChunks"
-- @include "brokenKeys"

-- moveToActive's flow control (docs/protocol.md, "Flow control"), decided in
-- the fetch so that it holds across any number of workers: a pause (meta
-- `limitedUntil`, which the caller read), the rate limit (rateMax starts in
-- any window of rateMs, the window in `limiterKey`; rateMax 0: none) and the
-- cap (maxActive jobs in `activeKey`; 0: none). `startedAt` is Redis's time of
-- the fetch (redisNowMs), the clock of both the pause and the window.
-- Returns how many of `limit` jobs may start, and when none may, how long
-- until one may (ms, > 0, at most rateMs for the rate limit; -1: until an
-- active job ends). A broken `limiterKey` goes in the reply's `broken`.
local function flowGate(limiterKey, activeKey, limitedUntil, startedAt, limit, rateMax, rateMs, maxActive)
  limitedUntil = tonumber(limitedUntil or "")
  -- (a pause is MAX_PAUSE_MS at most: a longer one, or inf, is another client's value, not ours)
  if limitedUntil and limitedUntil > startedAt and limitedUntil <= startedAt + MAX_PAUSE_MS then
    return 0, limitedUntil - startedAt
  end
  if rateMax > 0 then
    if type(redis.pcall("ZREMRANGEBYSCORE", limiterKey, "-inf", startedAt - rateMs)) ~= "number" then
      reportWrongType(limiterKey, "sorted set", "no job starts until it is deleted")
      return 0, rateMs
    end
    local room = rateMax - redis.call("ZCARD", limiterKey)
    if room <= 0 then
      local oldest = tonumber(redis.call("ZRANGE", limiterKey, 0, 0, "WITHSCORES")[2])
      if oldest > startedAt then
        reportBroken(limiterKey .. " holds starts scored after Redis's clock (another client's): they count " ..
          "against the rate limit until they are removed")
      end
      return 0, math.min(rateMs, math.max(1, oldest + rateMs - startedAt + 1))
    end
    limit = math.min(limit, room)
  end
  if maxActive > 0 then
    local room = maxActive - redis.call("LLEN", activeKey)
    if room <= 0 then
      return 0, -1
    end
    limit = math.min(limit, room)
  end
  return limit, nil
end

-- The fetch started the jobs `takenIds` at `startedAt`: under a rate limit,
-- each start enters the window. One member per attempt started: the token is
-- new for every fetch (an id is not: a caller may add the same id again once
-- the job is gone).
local function flowGateStarted(limiterKey, token, takenIds, startedAt, rateMax, rateMs)
  if rateMax > 0 then
    local starts = {}
    for _, id in ipairs(takenIds) do
      starts[#starts + 1] = startedAt
      starts[#starts + 1] = token .. "#" .. id
    end
    callInChunks("ZADD", limiterKey, starts)
    redis.call("PEXPIRE", limiterKey, rateMs)
  end
end
