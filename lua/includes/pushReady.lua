-- @include "groups"
-- @include "constants"

-- Put a ready job id where workers take it from. A job with a priority (hash
-- field `pri`, MIN_PRIORITY..MAX_PRIORITY, higher runs first) goes to the
-- `prioritized` ZSET, scored so that higher priorities come first and equal
-- ones keep FIFO order; any other job goes to `wait`, or to `paused` while the
-- queue is paused. The marker wakes a worker unless the queue is paused.
-- With `front`, sequence 0: ahead of every job of that priority.
local function priorityScore(metaKey, priority, front)
  -- (MAX_PRIORITY - priority) * 2^32 + sequence: exact in a double for 2^32 jobs per queue.
  local sequence = front and 0 or redis.call("HINCRBY", metaKey, "prioritySequence", 1) % 4294967296
  return (MAX_PRIORITY - priority) * 4294967296 + sequence
end

-- The priority in a raw `pri` field; anything but an integer from MIN_PRIORITY
-- to MAX_PRIORITY counts as 0, so a corrupt field can never make a script fail
-- halfway.
local function parsePriority(raw)
  local priority = raw and string.match(raw, "^%-?%d+$") and tonumber(raw) or 0
  if priority < MIN_PRIORITY or priority > MAX_PRIORITY then return 0 end
  return priority
end

-- A job with a group goes to its group's list (includes/groups.lua), or to
-- failed when that list is another client's key of another type.
-- With `front`, the job goes ahead of the others of its priority instead of
-- behind them (a job that gave way to a rate limit).
local function pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, front)
  local paused = redis.call("HEXISTS", metaKey, "paused") == 1
  -- pcall: a job key of another type counts as priority 0 and no group here;
  -- the worker that fetches the id sends it to failed.
  local raw = redis.pcall("HMGET", prefix .. id, "pri", "grp")
  if raw["err"] then raw = {} end
  local priority, group = parsePriority(raw[1]), groupOf(raw[2])
  local push = front and "RPUSH" or "LPUSH"  -- workers take from the right
  if group then
    -- (paused or not: moveToActive takes nothing while paused)
    if not groupPush(prefix, metaKey, id, group, front) then return end
  elseif priority ~= 0 then
    redis.call("ZADD", prioritizedKey, priorityScore(metaKey, priority, front), id)
  elseif paused then
    redis.call(push, pausedKey, id)
  else
    redis.call(push, waitKey, id)
  end
  if not paused then
    redis.call("ZADD", markerKey, 0, "0")
  end
end
