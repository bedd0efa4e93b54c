-- @include "lockIndex"

-- The hold after a gap in sweeping (moveStalledJobsToWait's header explains
-- it). Records Redis's time of this call in meta `sweptAt`; when the previous
-- call was more than interval + half a lock duration ago, opens (or extends) a
-- hold of one lock duration in meta `sweepHoldUntil`. Returns Redis's time now
-- and the end of the hold (0 or a past time when there is none).
local function sweepHold(metaKey, intervalMs, lockMs)
  local redisNow = redisNowMs()
  local sweptAt = tonumber(redis.call("HGET", metaKey, "sweptAt") or "")
  local holdUntil = tonumber(redis.call("HGET", metaKey, "sweepHoldUntil") or "") or 0
  if sweptAt and redisNow - sweptAt > intervalMs + lockMs / 2 then
    holdUntil = math.max(holdUntil, redisNow + lockMs)
    redis.call("HSET", metaKey, "sweepHoldUntil", holdUntil)
  end
  redis.call("HSET", metaKey, "sweptAt", redisNow)
  return redisNow, holdUntil
end
