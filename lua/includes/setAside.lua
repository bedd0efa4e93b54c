-- @include "emitEvent"
-- @include "pushReady"
-- @include "lockIndex"
-- @include "constants"
-- @include "parked"

-- The end of an attempt that used none (moveToFinished's outcomes other than
-- "completed" and "failed"): the job waits again, and says why. The caller has
-- taken it out of `active` and released its lock. Returns moveToFinished's code.
local function setAside(prefix, delayedKey, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, outcome,
                        value, backoffMs, now)
  if outcome == "limited" then
    -- The job raised RateLimited: it goes back ahead of the queue, and every
    -- worker's fetch waits out `limitedUntil` (moveToActive), on Redis's clock
    -- like the check.
    local redisNow = redisNowMs()
    local untilMs, current = redisNow + backoffMs, tonumber(redis.call("HGET", metaKey, "limitedUntil") or "")
    -- (a pause further than MAX_PAUSE_MS ahead, or inf, is not ours: moveToActive ignores it, and so does this)
    if not current or untilMs > current or current > redisNow + MAX_PAUSE_MS then
      redis.call("HSET", metaKey, "limitedUntil", untilMs)
    end
    pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, true)
    emitEvent(prefix, "limited", id, "until", untilMs)
    return 6
  end
  if outcome == "postponed" then  -- a task's own rate limit, or a durable sleep: later, and the queue goes on
    redis.call("ZADD", delayedKey, now + backoffMs, id)
    redis.call("ZADD", markerKey, 0, "0")
    emitEvent(prefix, "postponed", id, "until", now + backoffMs)
    return 7
  end
  -- "parked": a durable signal wait (includes/parked.lua), unless its signal
  -- came meanwhile or its deadline (backoffMs) passed: then straight back.
  if redis.call("HEXISTS", prefix .. id .. ":signals", "p:" .. value) == 1 or (backoffMs > 0 and backoffMs <= now) then
    pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id)
    return 9
  end
  parkJob(prefix, metaKey, id, value, backoffMs)
  return 8
end
