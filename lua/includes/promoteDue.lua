-- @include "emitEvent"
-- @include "pushReady"

-- Move up to `limit` delayed jobs whose due time has come to wait (or paused,
-- or prioritized), earliest first, so FIFO order follows due time. Returns how
-- many moved.
local function promoteDue(prefix, delayedKey, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, now, limit)
  local due = redis.call("ZRANGEBYSCORE", delayedKey, "-inf", now, "LIMIT", 0, limit)
  for _, id in ipairs(due) do
    redis.call("ZREM", delayedKey, id)
    emitEvent(prefix, "promoted", id)  -- (before a "failed" that pushReady may emit)
    pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id)
  end
  return #due
end
