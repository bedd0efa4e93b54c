-- @include "emitEvent"
-- @include "pushReady"

-- Jobs parked by a durable signal wait (docs/durable.md): `parked` (ZSET,
-- derived from the prefix) scores each by its wait's deadline ("+inf": none),
-- and the job's `park` names the signal it waits for. The earliest deadline is
-- kept in meta `parkedNext`, so a fetch (moveToActive) learns that one is due
-- from a field it reads anyway, and looks at `parked` only then. A parked job
-- holds no lock and no slot, and is in no other state.

local function parkJob(prefix, metaKey, id, name, deadline)
  redis.call("HSET", prefix .. id, "park", name)
  redis.call("ZADD", prefix .. "parked", deadline > 0 and deadline or "+inf", id)
  if deadline > 0 then
    local current = tonumber(redis.pcall("HGET", metaKey, "parkedNext") or "")
    if not current or deadline < current then redis.pcall("HSET", metaKey, "parkedNext", deadline) end
  end
  emitEvent(prefix, "parked", id, "signal", name)
end

-- Back to wait (or paused, or prioritized), out of `parked`; `why`: "signal" or "timeout".
local function unparkJob(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, why)
  redis.call("ZREM", prefix .. "parked", id)
  emitEvent(prefix, "resumed", id, "by", why)
  pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id)
end

-- Resume up to `limit` parked jobs whose deadline has come (the job itself
-- then raises SignalTimeout), and move `parkedNext` to the next deadline.
local function promoteParked(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, now, limit)
  local parkedKey = prefix .. "parked"
  local due = redis.call("ZRANGEBYSCORE", parkedKey, "-inf", now, "LIMIT", 0, limit)
  for _, id in ipairs(due) do
    unparkJob(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, "timeout")
  end
  local first = redis.call("ZRANGEBYSCORE", parkedKey, "-inf", "+inf", "WITHSCORES", "LIMIT", 0, 1)
  local nextAt = first[2] and tonumber(first[2])
  if nextAt and nextAt ~= math.huge then
    redis.call("HSET", metaKey, "parkedNext", nextAt)
  else
    redis.call("HDEL", metaKey, "parkedNext")
  end
  return nextAt ~= math.huge and nextAt or nil
end
