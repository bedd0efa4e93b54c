-- Move up to `limit` delayed jobs whose due time has come to wait (or paused),
-- earliest first, so FIFO order follows due time. Returns how many moved.
local function promoteDue(prefix, delayedKey, waitKey, pausedKey, metaKey, markerKey, now, limit)
  local due = redis.call("ZRANGEBYSCORE", delayedKey, "-inf", now, "LIMIT", 0, limit)
  for _, id in ipairs(due) do
    redis.call("ZREM", delayedKey, id)
    pushReady(waitKey, pausedKey, metaKey, markerKey, id)
    emitEvent(prefix, "promoted", id)
  end
  return #due
end
