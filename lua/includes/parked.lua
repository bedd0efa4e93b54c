-- @include "emitEvent"
-- @include "pushReady"
-- @include "jobKey"

-- Jobs parked by a durable signal wait (docs/durable.md): `parked` (ZSET,
-- derived from the prefix) scores each by its wait's deadline ("+inf": none),
-- and the job's `park` names the signal it waits for. The earliest deadline is
-- kept in meta `parkedNext`, so a fetch (moveToActive) learns that one is due
-- from a field it reads anyway, and looks at `parked` only then. A parked job
-- holds no lock and no slot, and is in no other state.

-- A time in ms another client cannot have broken, else nil: a number below
-- 2^53 (`inf`, `nan` or 1e300 would hold the fetch's resumes off, or come
-- back to a worker as an integer that overflowed and make it spin).
local function finiteMs(raw)
  local value = type(raw) == "string" and tonumber(raw) or nil
  if not value or value ~= value or value < 0 or value >= 9007199254740992 then return nil end
  return value
end

local function parkJob(prefix, metaKey, id, name, deadline)
  redis.call("HSET", prefix .. id, "park", name)
  redis.call("ZADD", prefix .. "parked", deadline > 0 and deadline or "+inf", id)
  if deadline > 0 then
    local current = finiteMs(redis.pcall("HGET", metaKey, "parkedNext"))
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
  -- pcall: a `parked` of another type (another client's) stops only the parked jobs' resumes, not the fetch.
  local due = redis.pcall("ZRANGEBYSCORE", parkedKey, "-inf", now, "LIMIT", 0, limit)
  if due["err"] then
    redis.pcall("HDEL", metaKey, "parkedNext")
    return nil
  end
  for _, id in ipairs(due) do
    if jobKey(prefix, id) then
      unparkJob(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, "timeout")
    else  -- a queue key's name another client put there: never fetched as a job
      redis.call("ZREM", parkedKey, id)
    end
  end
  local first = redis.call("ZRANGEBYSCORE", parkedKey, "-inf", "+inf", "WITHSCORES", "LIMIT", 0, 1)
  local nextAt = finiteMs(first[2])
  if nextAt then
    redis.call("HSET", metaKey, "parkedNext", nextAt)
  else
    redis.call("HDEL", metaKey, "parkedNext")
  end
  return nextAt
end
